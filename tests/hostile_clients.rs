//! Hostile clients (issue 25): every case the adversarial review found,
//! replayed. One module per concern; `prompt` covers what a client can put
//! into the prompt (chat markers in its text, deeply nested DSML).

mod common;

#[path = "hostile_clients/prompt.rs"]
mod prompt;
