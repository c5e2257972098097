//! The inference engine: requests in, responses out, continuously batched on one device.

mod batch_sampling;
mod block_hash;
mod block_manager;
pub mod chat;
pub mod constraint;
pub mod device_sampling;
mod drive;
mod handle;
pub mod jsonl;
mod llm_engine;
mod logit_rules;
mod metrics;
mod model_runner;
mod postprocess;
mod prompt_encoder;
mod request;
mod request_key;
mod retention;
pub mod sampler;
mod scheduler;
mod sequence;
mod shared_prefix;
mod splice;
mod summary;
pub mod tokenizer;
mod tool_syntax;

/// What an engine's replies are a function of, beside the request (its model, as computed).
pub use crate::model::ModelIdentity;
pub use block_manager::CacheStats;
pub use chat::{CalledFunction, ChatTemplate, Message, ToolCall};
pub use constraint::{Schema, SchemaError, SchemaId};
pub use drive::{Client, Fill, Queue, Refused};
pub use handle::{EngineHandle, EngineStatus, Pending, Sink};
pub use llm_engine::{Engine, EngineConfig, EngineError, default_kv_memory};
pub use logit_rules::{LogitRules, MAX_TOP_LOGPROBS, TokenLogprob};
pub use metrics::{EngineTotals, StepMetrics};
pub use prompt_encoder::{PromptEncoder, RequestKey};
pub use request::{FinishReason, Prompt, Request, RequestError, Response, Timings};
pub use request_key::KnownReplies;
pub use retention::KvPolicy;
pub use sampler::SamplingParams;
pub use shared_prefix::{PromptCost, SharedPrefix};
pub use splice::Spliced;
pub use summary::summary;
pub use tokenizer::Tokenizer;
pub use tool_syntax::ToolSyntax;
