//! `[model.sleep]`: a preset or explicit requests, and the bounds of a sleeping replica.

use std::time::Duration;

use toml::Spanned;

use super::{At, Cx, Res, UrlMark};
use crate::config::raw::{index, join, Opt, RawSleep, RawSleepRequest, RawStateRequest};
use crate::config::sleep::{
    preset, SleepConfig, SleepFormat, SleepRequest, StateRequest, DEFAULT_GPU_MEMORY_ASLEEP,
    DEFAULT_SLEEP_TIMEOUT, DEFAULT_WAKE_TIMEOUT,
};

/// What the sleep table needs to know of its model.
pub(super) struct Owner<'a> {
    /// "model[i]"
    pub key: &'a str,
    /// The model's `gpu_memory`, if it says.
    pub gpu_memory: Option<u64>,
    pub command: &'a [Spanned<String>],
    /// `pin = true`, and where.
    pub pin: Option<At>,
}

impl Cx<'_> {
    pub(super) fn sleep(
        &self,
        p: &str,
        raw: &Spanned<RawSleep>,
        owner: Owner<'_>,
        urls: &mut Vec<UrlMark>,
    ) -> Res<SleepConfig> {
        let here = Some(raw.span());
        let raw = raw.get_ref();
        let k = |name: &str| join(p, name);
        if let Some(pin) = owner.pin {
            return Err(self.err(
                &join(owner.key, "pin"),
                pin,
                "a pinned model is never put to sleep: leave out pin or [model.sleep]",
            ));
        }
        let format = match &raw.format {
            None => None,
            Some(f) => Some(self.choice(
                &k("format"),
                f,
                "a sleep format",
                &[
                    ("vllm", SleepFormat::Vllm),
                    ("sglang", SleepFormat::Sglang),
                    ("llamacpp", SleepFormat::Llamacpp),
                ],
            )?),
        };
        let level = match (&raw.level, format) {
            (None, _) => 1,
            (Some(l), Some(SleepFormat::Vllm)) => self.bounded(&k("level"), l, 1, 2)? as u8,
            (Some(l), _) => {
                return Err(self.err(
                    &k("level"),
                    Some(l.span()),
                    "a sleep level is vLLM's (format = \"vllm\"); leave it out",
                ))
            }
        };
        if format == Some(SleepFormat::Vllm) {
            self.vllm_on_loopback(&owner, here.clone())?;
        }
        let (mut sleep, mut wake, mut state) = match format {
            Some(f) => preset(f, level),
            None => (Vec::new(), Vec::new(), None),
        };
        if format.is_none() && (raw.sleep.is_none() || raw.wake.is_none()) {
            let missing = if raw.sleep.is_none() { "sleep" } else { "wake" };
            return Err(self.err(
                &k(missing),
                here,
                format!(
                    "missing; either format = \"vllm\", \"sglang\" or \"llamacpp\", or the \
                     requests that put a replica to sleep and wake it ([[model.sleep.sleep]] and \
                     [[model.sleep.wake]], each with a url; `{missing} = []` for none)"
                ),
            ));
        }
        // Requests the file writes out replace the preset's.
        if let Some(list) = &raw.sleep {
            sleep = self.requests(&k("sleep"), list, urls)?;
        }
        if let Some(list) = &raw.wake {
            wake = self.requests(&k("wake"), list, urls)?;
        }
        if let Some(s) = &raw.state {
            state = Some(self.state_request(&k("state"), s, urls)?);
        }
        if sleep.is_empty() && state.is_none() {
            return Err(self.err(
                &k("state"),
                here,
                "missing; a server put to sleep by no request falls asleep on its own, and only \
                 the state request ([model.sleep.state]) can tell when it has",
            ));
        }
        let gpu_memory_asleep = match &raw.gpu_memory_asleep {
            None => owner.gpu_memory.map_or(DEFAULT_GPU_MEMORY_ASLEEP, |g| {
                g.min(DEFAULT_GPU_MEMORY_ASLEEP)
            }),
            Some(s) => {
                let b = self.size0(&k("gpu_memory_asleep"), s)?;
                if let Some(g) = owner.gpu_memory.filter(|g| b > *g) {
                    return Err(self.err(
                        &k("gpu_memory_asleep"),
                        Some(s.span()),
                        format!(
                            "{} is more than the model's gpu_memory ({}): a sleeping replica \
                             holds less than an awake one",
                            crate::units::short_bytes(b),
                            crate::units::short_bytes(g)
                        ),
                    ));
                }
                b
            }
        };
        let host_memory = match &raw.host_memory {
            // vLLM's level 1 moves the weights to host RAM: at most what it held on the GPU.
            None if format == Some(SleepFormat::Vllm) && level == 1 => {
                owner.gpu_memory.unwrap_or(0)
            }
            None => 0,
            Some(s) => self.size0(&k("host_memory"), s)?,
        };
        let idle_to_sleep = match &raw.idle_to_sleep {
            None => None,
            Some(_) => Some(self.nonzero_duration(
                &k("idle_to_sleep"),
                &raw.idle_to_sleep,
                Duration::ZERO,
            )?),
        };
        Ok(SleepConfig {
            format,
            level,
            sleep,
            wake,
            state,
            host_memory,
            gpu_memory_asleep,
            wake_timeout: self.nonzero_duration(
                &k("wake_timeout"),
                &raw.wake_timeout,
                DEFAULT_WAKE_TIMEOUT,
            )?,
            sleep_timeout: self.nonzero_duration(
                &k("sleep_timeout"),
                &raw.sleep_timeout,
                DEFAULT_SLEEP_TIMEOUT,
            )?,
            idle_to_sleep,
        })
    }

    /// A size that may be zero.
    fn size0(&self, key: &str, raw: &Spanned<String>) -> Res<u64> {
        crate::units::parse_size(raw.get_ref())
            .map_err(|m| self.err(key, Some(raw.span()), m.to_string()))
    }

    /// vLLM serves `/sleep` only with `VLLM_SERVER_DEV_MODE=1`, which also opens
    /// `/collective_rpc` (any method on every worker) on the replica's port: only local users
    /// may reach it, so the server must listen on loopback. vLLM listens on every address
    /// unless `--host` says otherwise.
    fn vllm_on_loopback(&self, owner: &Owner<'_>, here: At) -> Res<()> {
        let args: Vec<&str> = owner.command.iter().map(|a| a.get_ref().as_str()).collect();
        let host = args
            .iter()
            .enumerate()
            .find_map(|(i, a)| match a.strip_prefix("--host") {
                Some("") => Some((i + 1, args.get(i + 1).copied())),
                Some(v) if v.starts_with('=') => Some((i, Some(&v[1..]))),
                _ => None,
            });
        let loopback = |h: &str| {
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        };
        match host {
            Some((_, Some(h))) if loopback(h) => Ok(()),
            Some((i, h)) => Err(self.err(
                &index(
                    &join(owner.key, "command"),
                    i.min(args.len().saturating_sub(1)),
                ),
                owner.command.get(i).map(Spanned::span).or(here),
                format!(
                    "vLLM's sleep mode needs VLLM_SERVER_DEV_MODE=1, which opens /collective_rpc \
                     to anyone who reaches the port; the server must listen on loopback, not {:?}",
                    h.unwrap_or("")
                ),
            )),
            None => Err(self.err(
                &join(owner.key, "command"),
                owner.command.first().map(Spanned::span).or(here),
                "vLLM's sleep mode needs VLLM_SERVER_DEV_MODE=1, which opens /collective_rpc to \
                 anyone who reaches the port, and vLLM listens on every address unless told: \
                 add \"--host\", \"127.0.0.1\" to the command",
            )),
        }
    }

    fn requests(
        &self,
        p: &str,
        list: &Spanned<Vec<Spanned<RawSleepRequest>>>,
        urls: &mut Vec<UrlMark>,
    ) -> Res<Vec<SleepRequest>> {
        if list.get_ref().len() > MAX_REQUESTS {
            return Err(self.err(
                p,
                Some(list.span()),
                format!("at most {MAX_REQUESTS} requests"),
            ));
        }
        list.get_ref()
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let key = index(p, i);
                let raw = r.get_ref();
                self.request(
                    &key,
                    Some(r.span()),
                    &raw.method,
                    &raw.url,
                    &raw.body,
                    "POST",
                    urls,
                )
            })
            .collect()
    }

    fn state_request(
        &self,
        p: &str,
        raw: &Spanned<RawStateRequest>,
        urls: &mut Vec<UrlMark>,
    ) -> Res<StateRequest> {
        let here = Some(raw.span());
        let r = raw.get_ref();
        let request = self.request(p, here.clone(), &r.method, &r.url, &r.body, "GET", urls)?;
        let asleep = self.required(
            &join(p, "asleep"),
            &r.asleep,
            here,
            "the text the answer holds while the replica sleeps, e.g. '\"is_sleeping\":true'",
        )?;
        self.nonempty(&join(p, "asleep"), asleep, "must not be empty")?;
        Ok(StateRequest {
            request,
            asleep: asleep.get_ref().clone(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        p: &str,
        here: At,
        method: &Opt<String>,
        url: &Opt<String>,
        body: &Opt<String>,
        default_method: &str,
        urls: &mut Vec<UrlMark>,
    ) -> Res<SleepRequest> {
        let k = |name: &str| join(p, name);
        let u = self.required(
            &k("url"),
            url,
            here,
            "the URL of the request, e.g. \"http://127.0.0.1:{port}/sleep?level=1\"",
        )?;
        let url = self.model_url(k("url"), u, urls)?;
        let method = match method {
            None => default_method.to_string(),
            Some(m) => {
                let v = m.get_ref();
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_alphabetic()) {
                    return Err(self.err(
                        &k("method"),
                        Some(m.span()),
                        format!("{v:?} is not an HTTP method (e.g. \"POST\", \"GET\")"),
                    ));
                }
                v.clone()
            }
        };
        if let Some(b) = body {
            self.template(&k("body"), b)?;
        }
        Ok(SleepRequest {
            method,
            url,
            body: body.as_ref().map(|b| b.get_ref().clone()),
        })
    }
}

/// Requests in one sleep or wake: a sequence, not a script.
const MAX_REQUESTS: usize = 8;
