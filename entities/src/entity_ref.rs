//! [`EntityRef`]: the handle callers use to talk to one entity.

use crate::entity::EntityType;
use crate::error::{AskError, EntityError};
use crate::id::EntityId;
use crate::partition::PartitionInput;
use crate::runner::Envelope;
use std::future::Future;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// A handle to one entity of type `E` on this node (Akka's `EntityRef`). Cheap to clone; it
/// stays valid across passivations (it names the entity, not an incarnation).
pub struct EntityRef<E: EntityType> {
    id: EntityId,
    partition: mpsc::Sender<PartitionInput<E>>,
    partition_capacity: usize,
    timeout: Duration,
}

impl<E: EntityType> Clone for EntityRef<E> {
    fn clone(&self) -> Self {
        EntityRef {
            id: self.id.clone(),
            partition: self.partition.clone(),
            partition_capacity: self.partition_capacity,
            timeout: self.timeout,
        }
    }
}

impl<E: EntityType> EntityRef<E> {
    pub(crate) fn new(
        id: EntityId,
        partition: mpsc::Sender<PartitionInput<E>>,
        partition_capacity: usize,
        timeout: Duration,
    ) -> Self {
        EntityRef {
            id,
            partition,
            partition_capacity,
            timeout,
        }
    }

    /// The entity's id.
    pub fn id(&self) -> &EntityId {
        &self.id
    }

    /// Sends `command` and waits for the reply, at most the host's ask timeout.
    ///
    /// The command is queued when this is called (not when the future is first polled); a
    /// full queue fails at once. After a timeout the command may still be carried out.
    pub fn ask(
        &self,
        command: E::Command,
    ) -> impl Future<Output = Result<E::Reply, AskError<E::Rejection>>> + Send + 'static + use<E>
    {
        self.ask_with_timeout(command, self.timeout)
    }

    /// [`EntityRef::ask`] with its own timeout.
    pub fn ask_with_timeout(
        &self,
        command: E::Command,
        timeout: Duration,
    ) -> impl Future<Output = Result<E::Reply, AskError<E::Rejection>>> + Send + 'static + use<E>
    {
        let (reply, answer) = oneshot::channel();
        let sent = self
            .partition
            .try_send(PartitionInput::Command {
                id: self.id.clone(),
                envelope: Envelope { command, reply },
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => EntityError::HostBusy {
                    entity: self.id.persistence_id(E::TYPE_NAME),
                    capacity: self.partition_capacity,
                },
                mpsc::error::TrySendError::Closed(_) => EntityError::ShuttingDown,
            });
        let id = self.id.clone();
        async move {
            sent?;
            match tokio::time::timeout(timeout, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(EntityError::Stopped {
                    entity: id.persistence_id(E::TYPE_NAME),
                }
                .into()),
                Err(_) => Err(EntityError::Timeout {
                    entity: id.persistence_id(E::TYPE_NAME),
                    timeout,
                }
                .into()),
            }
        }
    }
}
