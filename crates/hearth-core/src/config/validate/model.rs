//! One `[[model]]`: its launch keys, warm-up, liveness, signal and scaling.

use std::collections::BTreeMap;
use std::time::Duration;

use toml::Spanned;

use super::{at, Cx, Marks, Res, UrlMark};
use crate::config::raw::{
    index, join, Opt, RawLiveness, RawModel, RawScaling, RawSignal, RawWarmup, Templates,
};
use crate::config::{
    defaults, DeviceNaming, DownLimit, LaunchSpec, LivenessConfig, ModelConfig, Placement,
    ScalingConfig, ScrapeFormat, SignalConfig, WarmPool, WarmupConfig,
};
use crate::units::parse_duration;

/// `env` or `headers` as the typed config holds them.
fn plain(t: &Opt<Templates>) -> BTreeMap<String, String> {
    t.as_ref()
        .map(|t| {
            t.get_ref()
                .iter()
                .map(|(k, v)| (k.get_ref().clone(), v.get_ref().clone()))
                .collect()
        })
        .unwrap_or_default()
}

impl Cx<'_> {
    pub(super) fn model(&self, p: &str, raw: Spanned<RawModel>) -> Res<(ModelConfig, Marks)> {
        let here = Some(raw.span());
        let raw = raw.into_inner();
        let k = |name: &str| join(p, name);
        let name = self.required(
            &k("name"),
            &raw.name,
            here.clone(),
            "every [[model]] needs a name",
        )?;
        let command = self.required(
            &k("command"),
            &raw.command,
            here.clone(),
            "the command that starts the server, e.g. [\"vllm\", \"serve\", \"MODEL\", \"--port\", \"{port}\"]",
        )?;
        let warmup = self.required(
            &k("warmup"),
            &raw.warmup,
            here.clone(),
            "every [[model]] needs a [model.warmup] with the url of a real request (readiness)",
        )?;
        if name.get_ref().is_empty() {
            return Err(self.err(
                &k("name"),
                Some(name.span()),
                "model name must not be empty",
            ));
        }
        if let Some(c) = name
            .get_ref()
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(self.err(
                &k("name"),
                Some(name.span()),
                format!(
                    "model name {:?} contains {c:?}; only A-Z, a-z, 0-9, '.', '_' and '-' are allowed",
                    name.get_ref()
                ),
            ));
        }
        if let Some(v) = &raw.version {
            if v.get_ref().is_empty() {
                return Err(self.err(&k("version"), Some(v.span()), "must not be empty"));
            }
        }
        let Some(program) = command.get_ref().first() else {
            return Err(self.err(
                &k("command"),
                Some(command.span()),
                "command must not be empty",
            ));
        };
        if program.get_ref().is_empty() {
            return Err(self.err(
                &index(&k("command"), 0),
                Some(program.span()),
                "the program name must not be empty",
            ));
        }
        for (i, arg) in command.get_ref().iter().enumerate() {
            self.template(&index(&k("command"), i), arg)?;
        }
        if let Some(env) = &raw.env {
            for (name, value) in env.get_ref() {
                let key = join(&k("env"), name.get_ref());
                let n = name.get_ref();
                if n.is_empty() || n.contains('=') || n.contains('\0') {
                    return Err(self.err(
                        &key,
                        Some(name.span()),
                        "invalid environment variable name",
                    ));
                }
                self.template(&key, value)?;
            }
        }
        if let Some(user) = &raw.user {
            self.nonempty(&k("user"), user, "user name must not be empty")?;
        }
        let gpu_memory = match &raw.gpu_memory {
            None => None,
            Some(s) => Some(self.size(&k("gpu_memory"), s)?),
        };
        let placement = match &raw.placement {
            None => defaults::placement(),
            Some(s) => self.choice(
                &k("placement"),
                s,
                "a placement",
                &[("pack", Placement::Pack), ("spread", Placement::Spread)],
            )?,
        };
        let device_naming = match &raw.device_naming {
            None => defaults::device_naming(),
            Some(s) => self.choice(
                &k("device_naming"),
                s,
                "a device naming",
                &[("index", DeviceNaming::Index), ("uuid", DeviceNaming::Uuid)],
            )?,
        };
        self.env_leaves_devices_to_hearth(&k("env"), &raw.env, device_naming)?;
        let stop_grace =
            self.duration(&k("stop_grace"), &raw.stop_grace, Duration::from_secs(30))?;
        let mut urls = Vec::new();
        let warmup = self.warmup(&k("warmup"), warmup, &mut urls)?;
        let liveness = match &raw.liveness {
            None => None,
            Some(l) => Some(self.liveness(&k("liveness"), l, &mut urls)?),
        };
        let signal = match &raw.signal {
            None => None,
            Some(s) => Some(self.signal(&k("signal"), s, &mut urls)?),
        };
        let scaling = self.scaling(&k("scaling"), &raw.scaling)?;
        let pin = raw.pin.as_ref().is_some_and(|v| *v.get_ref());
        let sleep = match &raw.sleep {
            None => None,
            Some(s) => Some(self.sleep(
                &k("sleep"),
                s,
                super::sleep::Owner {
                    key: p,
                    gpu_memory,
                    command: command.get_ref(),
                    pin: raw.pin.as_ref().filter(|_| pin).map(|v| Some(v.span())),
                },
                &mut urls,
            )?),
        };
        let min_at = raw
            .scaling
            .as_ref()
            .and_then(|s| at(&s.get_ref().min))
            .or_else(|| at(&raw.scaling))
            .or_else(|| here.clone());
        let marks = Marks {
            key: p.to_string(),
            name: Some(name.span()),
            command: Some(command.span()),
            program: Some(program.span()),
            gpus: at(&raw.gpus).or_else(|| here.clone()),
            gpu_memory: at(&raw.gpu_memory).or_else(|| here.clone()),
            device_naming: at(&raw.device_naming).or_else(|| here.clone()),
            min: min_at,
            urls,
        };
        let launch = LaunchSpec {
            version: raw
                .version
                .map(Spanned::into_inner)
                .unwrap_or_else(defaults::version),
            command: command
                .get_ref()
                .iter()
                .map(|a| a.get_ref().clone())
                .collect(),
            env: plain(&raw.env),
            user: raw.user.map(Spanned::into_inner),
            gpus: raw
                .gpus
                .map(Spanned::into_inner)
                .unwrap_or_else(defaults::gpus),
            gpu_memory,
            placement,
            device_naming,
            prefetch: raw.prefetch.map(Spanned::into_inner).unwrap_or_default(),
            warmup,
        };
        let slots = match &raw.slots {
            None => crate::config::route::settings::DEFAULT_SLOTS,
            Some(v) => self.bounded(
                &k("slots"),
                v,
                1,
                i64::from(crate::config::route::settings::MAX_SLOTS),
            )? as u32,
        };
        let config = ModelConfig {
            name: name.get_ref().clone(),
            launch,
            start_alone: raw.start_alone.map(Spanned::into_inner).unwrap_or(true),
            priority: raw.priority.map(Spanned::into_inner).unwrap_or(0),
            slots,
            slots_declared: raw.slots.is_some(),
            stop_grace,
            liveness,
            signal,
            scaling,
            sleep,
            pin,
        };
        Ok((config, marks))
    }

    /// hearth names the replica's devices from its placement: `env` may not set the variables
    /// that would name others (a server would then use GPUs hearth reserved for someone else).
    fn env_leaves_devices_to_hearth(
        &self,
        key: &str,
        env: &Opt<Templates>,
        naming: DeviceNaming,
    ) -> Res<()> {
        let Some(env) = env else { return Ok(()) };
        for name in env.get_ref().keys() {
            let n = name.get_ref().as_str();
            let why = match n {
                "CUDA_VISIBLE_DEVICES" | "NVIDIA_VISIBLE_DEVICES" => format!(
                    "hearth sets {n} to the devices it placed the replica on, and its value \
                     always wins; choose how the devices are named with device_naming = \
                     \"index\" (NVML indices, what vLLM needs) or \"uuid\"; the UUIDs are also \
                     in {{gpus}}"
                ),
                "CUDA_DEVICE_ORDER" if naming == DeviceNaming::Index => format!(
                    "with device_naming = \"index\" hearth sets {n}=PCI_BUS_ID, so that CUDA \
                     numbers devices as NVML does; another order would hand the replica \
                     devices it was not placed on (use device_naming = \"uuid\" to leave \
                     {n} to the server)"
                ),
                _ => continue,
            };
            return Err(self.err(&join(key, n), Some(name.span()), why));
        }
        Ok(())
    }

    /// A URL of the model: checked now, and remembered for the `{port}` check.
    pub(super) fn model_url(
        &self,
        key: String,
        raw: &Spanned<String>,
        urls: &mut Vec<UrlMark>,
    ) -> Res<String> {
        self.url(&key, raw)?;
        urls.push(UrlMark {
            key,
            at: Some(raw.span()),
            url: raw.get_ref().clone(),
        });
        Ok(raw.get_ref().clone())
    }

    fn warmup(
        &self,
        p: &str,
        raw: &Spanned<RawWarmup>,
        urls: &mut Vec<UrlMark>,
    ) -> Res<WarmupConfig> {
        let here = Some(raw.span());
        let raw = raw.get_ref();
        let k = |name: &str| join(p, name);
        let url = self.required(
            &k("url"),
            &raw.url,
            here,
            "the URL of the warm-up request, e.g. \"http://127.0.0.1:{port}/v1/completions\"",
        )?;
        let method = match &raw.method {
            None => defaults::warmup_method(),
            Some(m) => {
                let method = m.get_ref();
                if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                    return Err(self.err(
                        &k("method"),
                        Some(m.span()),
                        format!("{method:?} is not an HTTP method (e.g. \"POST\", \"GET\")"),
                    ));
                }
                method.clone()
            }
        };
        let url = self.model_url(k("url"), url, urls)?;
        if let Some(body) = &raw.body {
            self.template(&k("body"), body)?;
        }
        if let Some(headers) = &raw.headers {
            for (name, value) in headers.get_ref() {
                let key = join(&k("headers"), name.get_ref());
                if name.get_ref().is_empty() {
                    return Err(self.err(&key, Some(name.span()), "header name must not be empty"));
                }
                self.template(&key, value)?;
            }
        }
        let expect_status = match &raw.expect_status {
            None => defaults::warmup_expect_status(),
            Some(s) => match u16::try_from(*s.get_ref()) {
                Ok(code) if (100..=599).contains(&code) => code,
                _ => {
                    return Err(self.err(
                        &k("expect_status"),
                        Some(s.span()),
                        format!("{} is not an HTTP status; expected 100..=599", s.get_ref()),
                    ))
                }
            },
        };
        Ok(WarmupConfig {
            method,
            url,
            body: raw.body.as_ref().map(|b| b.get_ref().clone()),
            headers: plain(&raw.headers),
            expect_status,
            expect_body: raw.expect_body.as_ref().map(|b| b.get_ref().clone()),
            timeout: self.nonzero_duration(
                &k("timeout"),
                &raw.timeout,
                defaults::warmup_timeout(),
            )?,
            startup_timeout: self.nonzero_duration(
                &k("startup_timeout"),
                &raw.startup_timeout,
                defaults::warmup_startup_timeout(),
            )?,
            recheck: self.nonzero_duration(
                &k("recheck"),
                &raw.recheck,
                defaults::warmup_recheck(),
            )?,
        })
    }

    fn liveness(
        &self,
        p: &str,
        raw: &Spanned<RawLiveness>,
        urls: &mut Vec<UrlMark>,
    ) -> Res<LivenessConfig> {
        let here = Some(raw.span());
        let raw = raw.get_ref();
        let k = |name: &str| join(p, name);
        let url = self.required(
            &k("url"),
            &raw.url,
            here,
            "the URL that answers 200 while the server lives, e.g. \"http://127.0.0.1:{port}/health\"",
        )?;
        let url = self.model_url(k("url"), url, urls)?;
        let failures = match &raw.failures {
            None => 3,
            Some(f) if *f.get_ref() == 0 => {
                return Err(self.err(&k("failures"), Some(f.span()), "must be at least 1"))
            }
            Some(f) => *f.get_ref(),
        };
        Ok(LivenessConfig {
            url,
            interval: self.nonzero_duration(
                &k("interval"),
                &raw.interval,
                Duration::from_secs(10),
            )?,
            timeout: self.nonzero_duration(&k("timeout"), &raw.timeout, Duration::from_secs(5))?,
            failures,
        })
    }

    fn signal(
        &self,
        p: &str,
        raw: &Spanned<RawSignal>,
        urls: &mut Vec<UrlMark>,
    ) -> Res<SignalConfig> {
        let here = Some(raw.span());
        let raw = raw.get_ref();
        let k = |name: &str| join(p, name);
        let format = self.required(
            &k("format"),
            &raw.format,
            here.clone(),
            "the metrics dialect: \"vllm\", \"llamacpp\", \"tgi\" or \"triton\"",
        )?;
        let format = self.choice(
            &k("format"),
            format,
            "a scrape format",
            &[
                ("vllm", ScrapeFormat::Vllm),
                ("llamacpp", ScrapeFormat::Llamacpp),
                ("tgi", ScrapeFormat::Tgi),
                ("triton", ScrapeFormat::Triton),
            ],
        )?;
        let scrape = self.required(
            &k("scrape"),
            &raw.scrape,
            here,
            "the metrics URL, e.g. \"http://127.0.0.1:{port}/metrics\"",
        )?;
        let scrape = self.model_url(k("scrape"), scrape, urls)?;
        let models =
            match &raw.models {
                None => Vec::new(),
                Some(m) if format != ScrapeFormat::Triton => return Err(self.err(
                    &k("models"),
                    Some(m.span()),
                    "only Triton serves several models behind one metrics page; leave models out",
                )),
                Some(m) if m.get_ref().is_empty() || m.get_ref().len() > 64 => {
                    return Err(self.err(
                        &k("models"),
                        Some(m.span()),
                        "between 1 and 64 Triton model names (leave the key out for every model)",
                    ))
                }
                Some(m) if m.get_ref().iter().any(|n| n.trim().is_empty()) => {
                    return Err(self.err(&k("models"), Some(m.span()), "a model name is empty"))
                }
                Some(m) => m.get_ref().clone(),
            };
        Ok(SignalConfig {
            scrape,
            format,
            models,
            interval: self.nonzero_duration(
                &k("interval"),
                &raw.interval,
                Duration::from_secs(1),
            )?,
        })
    }

    /// `"auto"` (the default) or a duration.
    fn down_limit(&self, key: &str, raw: &Opt<String>) -> Res<DownLimit> {
        match raw {
            None => Ok(DownLimit::Auto),
            Some(s) if s.get_ref() == "auto" => Ok(DownLimit::Auto),
            Some(s) => parse_duration(s.get_ref())
                .map(DownLimit::AtLeast)
                .map_err(|m| self.err(key, Some(s.span()), format!("{m} (or \"auto\")"))),
        }
    }

    fn scaling(&self, p: &str, raw: &Opt<RawScaling>) -> Res<ScalingConfig> {
        let empty = RawScaling::default();
        let raw = raw.as_ref().map(Spanned::get_ref).unwrap_or(&empty);
        let k = |name: &str| join(p, name);
        let min = raw.min.as_ref().map(|v| *v.get_ref()).unwrap_or(1);
        let max = raw.max.as_ref().map(|v| *v.get_ref()).unwrap_or(8);
        if max == 0 {
            return Err(self.err(&k("max"), at(&raw.max), "must be at least 1"));
        }
        if min > max {
            return Err(self.err(
                &k("min"),
                at(&raw.min).or_else(|| at(&raw.max)),
                format!("min ({min}) is larger than max ({max})"),
            ));
        }
        let warm_pool = match &raw.warm_pool {
            None => WarmPool::Fixed(0),
            Some(v) => match v.get_ref() {
                toml::Value::String(s) if s == "auto" => WarmPool::Auto,
                toml::Value::Integer(n) if (0..=i64::from(u32::MAX)).contains(n) => {
                    WarmPool::Fixed(*n as u32)
                }
                other => {
                    return Err(self.err(
                        &k("warm_pool"),
                        Some(v.span()),
                        format!("expected a non-negative integer or \"auto\", found {other}"),
                    ))
                }
            },
        };
        let down_below = match &raw.down_below {
            None => 0.5,
            Some(v) => match v.get_ref() {
                toml::Value::Float(f) => *f,
                toml::Value::Integer(n) => *n as f64,
                other => {
                    return Err(self.err(
                        &k("down_below"),
                        Some(v.span()),
                        format!("expected a number between 0 and 1, found {other}"),
                    ))
                }
            },
        };
        if !(down_below > 0.0 && down_below < 1.0) {
            return Err(self.err(
                &k("down_below"),
                at(&raw.down_below),
                format!("{down_below} is out of range; expected a number strictly between 0 and 1"),
            ));
        }
        let max_up_step = raw.max_up_step.as_ref().map(|v| *v.get_ref()).unwrap_or(4);
        if max_up_step == 0 {
            return Err(self.err(
                &k("max_up_step"),
                at(&raw.max_up_step),
                "must be at least 1",
            ));
        }
        let d = |name: &str, v: &Opt<String>, secs: u64| {
            self.duration(&k(name), v, Duration::from_secs(secs))
        };
        Ok(ScalingConfig {
            min,
            max,
            warm_pool,
            target_wait: self.nonzero_duration(
                &k("target_wait"),
                &raw.target_wait,
                Duration::from_millis(500),
            )?,
            down_below,
            down_stabilization: self
                .down_limit(&k("down_stabilization"), &raw.down_stabilization)?,
            down_step: self.down_limit(&k("down_step"), &raw.down_step)?,
            max_up_step,
            forecast: raw.forecast.as_ref().is_some_and(|v| *v.get_ref()),
            idle_to_zero: d("idle_to_zero", &raw.idle_to_zero, 1800)?,
            drain_timeout: d("drain_timeout", &raw.drain_timeout, 300)?,
            stale_after: self.nonzero_duration(
                &k("stale_after"),
                &raw.stale_after,
                Duration::from_secs(5),
            )?,
        })
    }
}
