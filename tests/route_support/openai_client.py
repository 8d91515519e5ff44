#!/usr/bin/env python3
"""Drives the front door with the official `openai` client; prints what it saw as JSON.
Usage: openai_client.py BASE_URL API_KEY MODEL ALIAS"""
import json
import sys

import openai

base, key, model, alias = sys.argv[1:5]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
out = {"version": openai.__version__}

out["models"] = [m.id for m in client.models.list().data]

r = client.chat.completions.create(
    model=alias, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4)
out["chat"] = {"content_is_str": isinstance(r.choices[0].message.content, str),
               "completion_tokens": r.usage.completion_tokens if r.usage else None,
               "finish_reason": r.choices[0].finish_reason}

chunks, text, finish = 0, "", None
for c in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count"}], max_tokens=4, stream=True):
    chunks += 1
    if c.choices:
        text += c.choices[0].delta.content or ""
        finish = c.choices[0].finish_reason or finish
out["chat_stream"] = {"chunks": chunks, "finish_reason": finish, "text_len": len(text)}

r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4)
out["completion"] = {"text_is_str": isinstance(r.choices[0].text, str),
                     "completion_tokens": r.usage.completion_tokens if r.usage else None}

chunks, text = 0, ""
for c in client.completions.create(model=alias, prompt="Once", max_tokens=4, stream=True):
    chunks += 1
    if c.choices:
        text += c.choices[0].text or ""
out["completion_stream"] = {"chunks": chunks}

try:
    client.chat.completions.create(model="no-such-model",
                                   messages=[{"role": "user", "content": "x"}], max_tokens=1)
    out["unknown_model"] = "no error"
except openai.NotFoundError as e:
    out["unknown_model"] = {"status": e.status_code, "code": e.code}

try:
    openai.OpenAI(base_url=base, api_key="wrong-key-0123456789", max_retries=0).models.list()
    out["bad_key"] = "no error"
except openai.AuthenticationError as e:
    out["bad_key"] = {"status": e.status_code, "code": e.code}

print(json.dumps(out))
