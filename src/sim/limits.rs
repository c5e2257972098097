//! Limits that more than one section of an experiment's config holds to.

/// The most a sampling temperature may be (of decisions and of personas): beyond it replies
/// are noise.
pub const MAX_TEMPERATURE: f32 = 10.0;
