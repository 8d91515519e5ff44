//! llama.cpp's real server with a tiny model (scripts/real-model.sh; the genuine binary from
//! scripts/llama-server.sh for the sleeping tier): served through hearth, and
//! its queue scraped. One binary per area of the integration tests (tests/README.md).

mod scrape_llamacpp;
mod serve;
mod sleep_llamacpp;
