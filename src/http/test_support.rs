//! A fake [`ClusterControl`] for the router tests: a fixed membership, recorded commands and
//! a settable failure.

use super::{ClusterControl, ControlError, MemberView, MembersView, NodeMetrics};
use std::sync::Mutex;
use tessera_cluster::{Address, MemberStatus};

/// A command the fake received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Join(Address),
    Leave(Address),
    Down(Address),
}

pub struct FakeControl {
    pub view: Mutex<MembersView>,
    pub metrics: NodeMetrics,
    pub calls: Mutex<Vec<Call>>,
    /// Returned by every command when set.
    pub fail_with: Mutex<Option<ControlError>>,
}

pub fn addr(s: &str) -> Address {
    s.parse().unwrap()
}

impl FakeControl {
    /// Two Up members, 127.0.0.1:25520 (self, leader) and 127.0.0.1:25521.
    pub fn two_up() -> Self {
        let member = |a: &str, uid, up_number, roles: &[&str]| MemberView {
            address: addr(a),
            uid,
            status: MemberStatus::Up,
            roles: roles.iter().map(|r| r.to_string()).collect(),
            reachable: true,
            up_number,
        };
        Self {
            view: Mutex::new(MembersView {
                self_address: addr("127.0.0.1:25520"),
                self_status: Some(MemberStatus::Up),
                leader: Some(addr("127.0.0.1:25520")),
                members: vec![
                    member("127.0.0.1:25520", 7, 1, &[]),
                    member("127.0.0.1:25521", 8, 2, &["backend"]),
                ],
            }),
            metrics: NodeMetrics::default(),
            calls: Mutex::new(Vec::new()),
            fail_with: Mutex::new(None),
        }
    }

    pub fn set_self_status(&self, status: Option<MemberStatus>) {
        self.view.lock().unwrap().self_status = status;
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn command(&self, call: Call) -> Result<(), ControlError> {
        if let Some(err) = self.fail_with.lock().unwrap().clone() {
            return Err(err);
        }
        let known = |a: &Address| {
            self.view
                .lock()
                .unwrap()
                .members
                .iter()
                .any(|m| &m.address == a)
        };
        match &call {
            Call::Leave(a) | Call::Down(a) if !known(a) => {
                return Err(ControlError::UnknownMember(a.clone()));
            }
            _ => {}
        }
        self.calls.lock().unwrap().push(call);
        Ok(())
    }
}

impl ClusterControl for FakeControl {
    fn members(&self) -> MembersView {
        self.view.lock().unwrap().clone()
    }

    fn join(&self, address: Address) -> Result<(), ControlError> {
        self.command(Call::Join(address))
    }

    fn leave(&self, address: Address) -> Result<(), ControlError> {
        self.command(Call::Leave(address))
    }

    fn down(&self, address: Address) -> Result<(), ControlError> {
        self.command(Call::Down(address))
    }

    fn metrics(&self) -> NodeMetrics {
        self.metrics.clone()
    }
}
