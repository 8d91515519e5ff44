//! Applying a new configuration to a running node.

use super::event::{Action, LogLevel, RequestId};
use super::model::ModelState;
use super::node::Node;
use super::Time;
use crate::config::Config;
use crate::protocol;

impl Node {
    /// Applies a validated configuration: untouched models keep their replicas, scaling changes
    /// apply at once, new models start, removed models drain away.
    pub(super) fn reload(
        &mut self,
        id: Option<RequestId>,
        config: Config,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        for mc in &config.models {
            match self.models.get_mut(&mc.name) {
                Some(m) => {
                    if m.config != *mc {
                        m.config = mc.clone();
                        m.removed = false;
                        let name = mc.name.clone();
                        self.log(
                            LogLevel::Info,
                            &name,
                            None,
                            "configuration changed".into(),
                            out,
                        );
                    }
                }
                None => {
                    let m = ModelState::new(mc.clone(), Default::default(), now);
                    self.models.insert(mc.name.clone(), m);
                    self.log(LogLevel::Info, &mc.name, None, "model added".into(), out);
                }
            }
        }
        let gone: Vec<String> = self
            .models
            .keys()
            .filter(|name| config.model(name).is_none())
            .cloned()
            .collect();
        for name in gone {
            let m = self.models.get_mut(&name).expect("present");
            if !m.removed {
                m.removed = true;
                self.log(
                    LogLevel::Info,
                    &name,
                    None,
                    "model removed from the configuration: draining".into(),
                    out,
                );
            }
            if !self.replicas.values().any(|r| r.model == name) {
                self.models.remove(&name);
            }
        }
        self.ports.set_range(config.daemon.ports);
        self.config = config;
        if let Some(id) = id {
            out.push(Action::Reply {
                id,
                response: protocol::ok(),
            });
        }
    }
}
