//! API errors: a status code and the JSON body of SERVER.md §3.4.

use serde_json::json;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    /// The complete body, ending in `\n`.
    pub body: String,
    /// Seconds for `Retry-After` (queue full).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: u16, message: &str) -> ApiError {
        let body = json!({"error": {"message": message, "type": "invalid_request_error"}});
        ApiError {
            status,
            body: format!("{body}\n"),
            retry_after: None,
        }
    }

    /// 400 with the generic body.
    pub fn invalid(message: &str) -> ApiError {
        ApiError::new(400, message)
    }

    /// The context-length error: OpenAI shape, or Anthropic's.
    pub fn context(prompt: usize, ctx: usize, param: &str, anthropic: bool) -> ApiError {
        let msg =
            format!("Prompt has {prompt} tokens, but the configured context size is {ctx} tokens");
        ApiError::context_msg(&msg, json!(prompt), ctx, param, anthropic)
    }

    /// The context-length error for a prompt refused by its byte length,
    /// before it was tokenized (`n_prompt_tokens` is then unknown: null).
    pub fn prompt_bytes(
        bytes: usize,
        limit: usize,
        ctx: usize,
        param: &str,
        anthropic: bool,
    ) -> ApiError {
        let msg = format!(
            "Prompt has {bytes} bytes; no prompt over {limit} bytes fits the configured context size of {ctx} tokens"
        );
        ApiError::context_msg(&msg, serde_json::Value::Null, ctx, param, anthropic)
    }

    fn context_msg(
        msg: &str,
        prompt: serde_json::Value,
        ctx: usize,
        param: &str,
        anthropic: bool,
    ) -> ApiError {
        let body = if anthropic {
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": msg,
                "n_prompt_tokens": prompt, "n_ctx": ctx}})
        } else {
            json!({"error": {"message": msg, "type": "invalid_request_error", "param": param,
                "code": "context_length_exceeded", "n_prompt_tokens": prompt, "n_ctx": ctx}})
        };
        ApiError {
            status: 400,
            body: format!("{body}\n"),
            retry_after: None,
        }
    }
}
