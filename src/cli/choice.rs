//! The command line's spellings of the library's enums. clap's derives stay here, not on the
//! library's types: each choice is a CLI enum of its own (its variants' docs are the help
//! text) that converts both ways to the library's, so that a variant added on either side
//! without the other fails to build, and a test holds each spelling to the library's name.

use crate::engine::KvPolicy;
use crate::model::synthetic::Shape;
use crate::model::{AttentionBackend, KvFormat, WeightFormat};
use crate::sim::config::{PolicyKind, Split};
use clap::builder::{EnumValueParser, TypedValueParser};

/// A CLI enum `$name` mirroring the library's `$library`, variant for variant, and
/// `$name::parser()`, which reads the library's type from the command line.
macro_rules! choice {
    ($(#[$meta:meta])* $name:ident => $library:ident {
        $($(#[$attr:meta])* $variant:ident,)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
        pub enum $name {
            $($(#[$attr])* $variant,)*
        }

        impl From<$name> for $library {
            fn from(choice: $name) -> Self {
                match choice {
                    $($name::$variant => $library::$variant,)*
                }
            }
        }

        impl From<$library> for $name {
            fn from(value: $library) -> Self {
                match value {
                    $($library::$variant => $name::$variant,)*
                }
            }
        }

        impl $name {
            /// Parses the command line's spelling into the library's type, listing the
            /// spellings (with their help) as clap's own value enums do.
            pub fn parser() -> impl TypedValueParser<Value = $library> {
                EnumValueParser::<$name>::new().map($library::from)
            }
        }
    };
}

choice! {
    /// `--weights`.
    WeightsArg => WeightFormat {
        /// On a CPU with a SIMD integer kernel (AVX2 or AVX-512 VNNI): a GGUF file's blocks as
        /// stored (gguf), other weights as int8; otherwise f32 while the dense model fits the
        /// memory budget, else bf16; bf16 on CUDA.
        Auto,
        /// Keep whatever the file stores (GGUF quantized types run by candle's kernels).
        Native,
        F32,
        F16,
        Bf16,
        #[value(name = "q8_0")]
        Q8_0,
        /// 8-bit weights in blocks of 32 (quantized from the file's values), activations in
        /// two 8-bit parts per block, integer dot products (CPU).
        Int8,
        /// A GGUF file's own blocks as stored (Q4_0, Q4_1, Q4_K, Q8_0; other types as 8-bit
        /// blocks), activations in two 8-bit parts per block (some 16 bits: f32's next-token
        /// distributions to 1e-6 KL), integer dot products (CPU).
        Gguf,
        /// As gguf, activations in 8 bits per block of 32 (as llama.cpp): about 1.6 times
        /// gguf's speed on batches on AVX2, at llama.cpp's accuracy, which changes some replies.
        Gguf8,
    }
}

choice! {
    /// `--kv-format`.
    KvFormatArg => KvFormat {
        /// f16 on the CPU (half the bytes, within the quality gate), the model's dtype on a GPU.
        Auto,
        /// The model's activation dtype: f32 on the CPU, bf16 on a GPU.
        Model,
        F32,
        F16,
    }
}

choice! {
    /// `throng bench --attention`.
    AttentionArg => AttentionBackend {
        /// The paged CPU kernel: f32 queries over an f32 or f16 cache on the CPU, batch
        /// invariant.
        PagedCpu,
        /// Gathered keys and values with dense matmuls: any device and dtype.
        Gathered,
        /// Paged FlashAttention-2 on CUDA: bf16, head size 64 or 128, blocks a multiple of 32
        /// (built with the `flash-attn` feature).
        FlashPaged,
    }
}

choice! {
    /// `throng bench --shape`.
    ShapeArg => Shape {
        /// The tiny model of throng's own tests: 2 layers, hidden 64, a byte vocabulary.
        #[value(name = "tiny")]
        Tiny,
        /// Llama 3.2 1B: 16 layers, hidden 2048, head size 64, tied embeddings.
        #[value(name = "llama-3.2-1b")]
        Llama32_1b,
        /// Llama 3.2 3B: 28 layers, hidden 3072, head size 128, tied embeddings.
        #[value(name = "llama-3.2-3b")]
        Llama32_3b,
        /// Llama 3.1 8B: 32 layers, hidden 4096, head size 128.
        #[value(name = "llama-3.1-8b")]
        Llama31_8b,
        /// A small Mixtral: 8 layers, hidden 1024, 8 experts of 2048 with 2 per token, a byte
        /// vocabulary (0.42 B parameters, 0.13 B active).
        #[value(name = "mixtral-small")]
        MixtralSmall,
        /// `mixtral-small` with one dense MLP of 4096 in place of its experts: the same active
        /// parameters per token, an eighth of the expert weights.
        #[value(name = "mixtral-small-dense")]
        MixtralSmallDense,
    }
}

choice! {
    /// `--kv-policy`: which cached KV blocks go first when the cache is full.
    KvPolicyArg => KvPolicy {
        /// Least recently freed first.
        Lru,
        /// Blocks no announced caller needs first, then those whose caller is called again
        /// furthest in the future: simulations and `throng bench` announce each step's agents,
        /// in order (LRU where nobody announces).
        NextCall,
    }
}

choice! {
    /// `throng run --policy`.
    PolicyArg => PolicyKind {
        /// Ask the language model (all agents of a step in one batch).
        Llm,
        /// The scenario's deterministic rules: a classic agent-based baseline.
        Scripted,
    }
}

choice! {
    /// `throng run --split`.
    SplitArg => Split {
        /// `cells` when the cells of a population size can be dealt out evenly, else `agents`.
        Auto,
        /// Cells (arms x replicates) are dealt out to ranks; each steps its own.
        Cells,
        /// Every rank holds every cell and decides for its share of the agents; decisions are
        /// exchanged every step.
        Agents,
        /// Every rank holds every cell; each model belongs to one rank (the run's `i`-th model
        /// to rank `i % ranks`), which alone loads it and decides for its agents (scripted
        /// agents go with their cell, cell `c` to rank `c % ranks`); decisions are exchanged
        /// every step. A device then holds only the models its agents need.
        Models,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// The command line's spelling of each choice, in the order it lists them.
    fn spellings<C: ValueEnum>() -> Vec<String> {
        C::value_variants()
            .iter()
            .map(|v| v.to_possible_value().unwrap().get_name().to_string())
            .collect()
    }

    /// How configs and manifests (serde) spell `values`.
    fn serde_names<T: serde::Serialize>(values: impl IntoIterator<Item = T>) -> Vec<String> {
        values
            .into_iter()
            .map(|v| {
                serde_json::to_value(v)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[test]
    // Guards the one spelling of each value: a flag that accepted another name than the
    // config, the manifest (`weight_format`) or the library's `name()` would split them.
    fn the_command_line_spells_every_value_as_the_library_does() {
        let weights: Vec<_> = WeightsArg::value_variants()
            .iter()
            .map(|&w| WeightFormat::from(w))
            .collect();
        assert_eq!(spellings::<WeightsArg>(), serde_names(weights.clone()));
        let names: Vec<_> = weights.iter().map(|w| w.name().to_string()).collect();
        assert_eq!(spellings::<WeightsArg>(), names);
        assert_eq!(weights, WeightFormat::ALL);

        let attention = AttentionArg::value_variants()
            .iter()
            .map(|&a| AttentionBackend::from(a));
        assert_eq!(spellings::<AttentionArg>(), serde_names(attention));

        let kv: Vec<_> = KvFormatArg::value_variants()
            .iter()
            .map(|&k| KvFormat::from(k))
            .collect();
        assert_eq!(spellings::<KvFormatArg>(), serde_names(kv.clone()));
        let names: Vec<_> = kv.iter().map(|k| k.name().to_string()).collect();
        assert_eq!(spellings::<KvFormatArg>(), names);
        assert_eq!(kv, KvFormat::ALL);

        let shapes: Vec<_> = ShapeArg::value_variants()
            .iter()
            .map(|&s| Shape::from(s))
            .collect();
        assert_eq!(spellings::<ShapeArg>(), serde_names(shapes.clone()));
        let names: Vec<_> = shapes.iter().map(|s| s.name().to_string()).collect();
        assert_eq!(spellings::<ShapeArg>(), names);
        assert_eq!(shapes, Shape::ALL);

        let policies: Vec<_> = PolicyArg::value_variants()
            .iter()
            .map(|&p| PolicyKind::from(p))
            .collect();
        assert_eq!(spellings::<PolicyArg>(), serde_names(policies.clone()));
        let names: Vec<_> = policies.iter().map(|p| p.name().to_string()).collect();
        assert_eq!(spellings::<PolicyArg>(), names);

        let splits = SplitArg::value_variants().iter().map(|&s| Split::from(s));
        assert_eq!(spellings::<SplitArg>(), serde_names(splits));

        let kv: Vec<_> = KvPolicyArg::value_variants()
            .iter()
            .map(|&p| KvPolicy::from(p))
            .collect();
        let names: Vec<_> = kv.iter().map(|p| p.name().to_string()).collect();
        assert_eq!(spellings::<KvPolicyArg>(), names);
        assert_eq!(kv, KvPolicy::ALL);
    }
}
