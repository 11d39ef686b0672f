//! `account`: the example entity type the `tessera` binary registers. A balance that deposits
//! raise and withdrawals lower, never below zero.
//!
//! Over HTTP: `{"deposit": n}`, `{"withdraw": n}` and `{"get": null}`, each answered with
//! `{"balance": n}`; a withdrawal larger than the balance is rejected (409) and persists
//! nothing.
//!
//! [`projections`]: the accounts' read models in PostgreSQL, one exactly once and one at
//! least once.

pub mod projections;

use serde::{Deserialize, Serialize};
use std::fmt;
use tessera::{Effect, EntityType};

/// The `account` entity type.
#[derive(Debug, Clone, Copy, Default)]
pub struct Account;

/// What a caller can ask an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccountCommand {
    /// Adds to the balance.
    Deposit(u64),
    /// Takes from the balance; rejected when the balance is lower.
    Withdraw(u64),
    /// Reads the balance.
    Get,
}

/// What an account persists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccountEvent {
    Deposited { amount: u64 },
    Withdrawn { amount: u64 },
}

/// An account's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountState {
    pub balance: u64,
}

/// Every reply: the balance after the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balance {
    pub balance: u64,
}

/// Why an account refused a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccountRejection {
    /// The withdrawal is larger than the balance.
    InsufficientFunds { balance: u64, requested: u64 },
    /// The deposit would take the balance past `u64::MAX`.
    BalanceOverflow { balance: u64, deposit: u64 },
}

impl fmt::Display for AccountRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AccountRejection::InsufficientFunds { balance, requested } => write!(
                f,
                "insufficient funds: cannot withdraw {requested} from a balance of {balance}"
            ),
            AccountRejection::BalanceOverflow { balance, deposit } => write!(
                f,
                "a deposit of {deposit} would overflow the balance of {balance}"
            ),
        }
    }
}

fn balance(state: &AccountState) -> Balance {
    Balance {
        balance: state.balance,
    }
}

impl EntityType for Account {
    type Command = AccountCommand;
    type Event = AccountEvent;
    type State = AccountState;
    type Reply = Balance;
    type Rejection = AccountRejection;

    const TYPE_NAME: &'static str = "account";
    const EVENT_MANIFEST: &'static str = "account.Event";
    const STATE_MANIFEST: &'static str = "account.State";

    fn initial_state(&self, _entity_id: &str) -> AccountState {
        AccountState::default()
    }

    fn handle_command(&self, state: &AccountState, command: AccountCommand) -> Effect<Self> {
        match command {
            AccountCommand::Deposit(amount) => match state.balance.checked_add(amount) {
                Some(_) => Effect::persist(AccountEvent::Deposited { amount }).then_reply(balance),
                None => Effect::reject(AccountRejection::BalanceOverflow {
                    balance: state.balance,
                    deposit: amount,
                }),
            },
            AccountCommand::Withdraw(amount) if amount > state.balance => {
                Effect::reject(AccountRejection::InsufficientFunds {
                    balance: state.balance,
                    requested: amount,
                })
            }
            AccountCommand::Withdraw(amount) => {
                Effect::persist(AccountEvent::Withdrawn { amount }).then_reply(balance)
            }
            AccountCommand::Get => Effect::reply(balance(state)),
        }
    }

    fn apply_event(&self, state: &mut AccountState, event: &AccountEvent) {
        // The command handler only persists what keeps the balance in range; saturating keeps
        // a hand-edited log from panicking recovery.
        match event {
            AccountEvent::Deposited { amount } => {
                state.balance = state.balance.saturating_add(*amount)
            }
            AccountEvent::Withdrawn { amount } => {
                state.balance = state.balance.saturating_sub(*amount)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn command(value: serde_json::Value) -> Result<AccountCommand, serde_json::Error> {
        serde_json::from_value(value)
    }

    #[test]
    fn commands_have_the_documented_json_shape() {
        assert_eq!(
            command(json!({"deposit": 5})).unwrap(),
            AccountCommand::Deposit(5)
        );
        assert_eq!(
            command(json!({"withdraw": 2})).unwrap(),
            AccountCommand::Withdraw(2)
        );
        assert_eq!(command(json!({"get": null})).unwrap(), AccountCommand::Get);
        assert!(command(json!({"deposit": -1})).is_err());
        assert!(command(json!({"deposit": "5"})).is_err());
        assert!(command(json!({"transfer": 1})).is_err());
        assert_eq!(
            serde_json::to_value(Balance { balance: 3 }).unwrap(),
            json!({"balance": 3})
        );
    }

    #[test]
    fn withdrawing_more_than_the_balance_is_rejected_without_events() {
        let mut account = tessera::testkit::EntityTestKit::new(Account, "a").unwrap();
        assert_eq!(
            account.run(AccountCommand::Deposit(3)).unwrap().reply,
            Ok(Balance { balance: 3 })
        );
        let refused = account.run(AccountCommand::Withdraw(5)).unwrap();
        assert_eq!(
            refused.reply,
            Err(AccountRejection::InsufficientFunds {
                balance: 3,
                requested: 5
            })
        );
        assert!(refused.events.is_empty());
        assert_eq!(
            refused.reply.unwrap_err().to_string(),
            "insufficient funds: cannot withdraw 5 from a balance of 3"
        );
        account.restart().unwrap();
        assert_eq!(account.state().balance, 3);
    }
}
