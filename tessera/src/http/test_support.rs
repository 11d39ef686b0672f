//! A fake [`ClusterControl`] for the router tests: a fixed membership, recorded commands, a
//! settable failure and a scripted join outcome.

use super::{ClusterControl, ControlError, MemberView, MembersView, NodeMetrics};
use std::sync::Mutex;
use std::time::{Duration, Instant};
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
    /// How long after a join this node shows itself Up in the joined cluster; None: never.
    pub join_confirmed_after: Mutex<Option<Duration>>,
    /// A join that will show in the membership: the address joined, and from when.
    pending_join: Mutex<Option<(Address, Instant)>>,
    /// Why the node is not ready beyond its member status (unregistered shard regions).
    pub not_ready: Mutex<Option<String>>,
}

fn member(address: &str, uid: u64, up_number: i32, roles: &[&str]) -> MemberView {
    MemberView {
        address: addr(address),
        uid,
        status: MemberStatus::Up,
        roles: roles.iter().map(|r| r.to_string()).collect(),
        reachable: true,
        up_number,
    }
}

pub fn addr(s: &str) -> Address {
    s.parse().unwrap()
}

impl FakeControl {
    /// Two Up members, 127.0.0.1:25520 (self, leader) and 127.0.0.1:25521.
    pub fn two_up() -> Self {
        Self::with_view(MembersView {
            self_address: addr("127.0.0.1:25520"),
            self_status: Some(MemberStatus::Up),
            leader: Some(addr("127.0.0.1:25520")),
            members: vec![
                member("127.0.0.1:25520", 7, 1, &[]),
                member("127.0.0.1:25521", 8, 2, &["backend"]),
            ],
        })
    }

    /// 127.0.0.1:25520, not a member of any cluster yet; a join shows as Up in the joined
    /// cluster after `join_confirmed_after` (never when None).
    pub fn not_a_member(join_confirmed_after: Option<Duration>) -> Self {
        let fake = Self::with_view(MembersView {
            self_address: addr("127.0.0.1:25520"),
            self_status: None,
            leader: None,
            members: Vec::new(),
        });
        *fake.join_confirmed_after.lock().unwrap() = join_confirmed_after;
        fake
    }

    fn with_view(view: MembersView) -> Self {
        Self {
            view: Mutex::new(view),
            metrics: NodeMetrics::default(),
            calls: Mutex::new(Vec::new()),
            fail_with: Mutex::new(None),
            join_confirmed_after: Mutex::new(None),
            pending_join: Mutex::new(None),
            not_ready: Mutex::new(None),
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

    /// Applies a pending join whose time has come: self Up, with the joined address (and
    /// self) among the members.
    fn apply_pending_join(&self, view: &mut MembersView) {
        let mut pending = self.pending_join.lock().unwrap();
        let Some((joined, _)) = pending.take_if(|(_, at)| *at <= Instant::now()) else {
            return;
        };
        view.self_status = Some(MemberStatus::Up);
        for address in [view.self_address.clone(), joined] {
            if !view.members.iter().any(|m| m.address == address) {
                let up_number = view.members.len() as i32 + 1;
                view.members.push(MemberView {
                    address,
                    ..member("127.0.0.1:1", 1, up_number, &[])
                });
            }
        }
    }
}

impl ClusterControl for FakeControl {
    fn members(&self) -> MembersView {
        let mut view = self.view.lock().unwrap();
        self.apply_pending_join(&mut view);
        view.clone()
    }

    fn join(&self, address: Address) -> Result<(), ControlError> {
        self.command(Call::Join(address.clone()))?;
        if let Some(after) = *self.join_confirmed_after.lock().unwrap() {
            *self.pending_join.lock().unwrap() = Some((address, Instant::now() + after));
        }
        Ok(())
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

    fn not_ready_reason(&self) -> Option<String> {
        self.not_ready.lock().unwrap().clone()
    }
}
