//! The paged CPU kernel: f32 queries against keys and values read in place from the cache's
//! blocks, nothing gathered, one rayon task per `(sequence, kv head, up to 16 query rows)` item.
//!
//! **Shared prefixes (cascade attention).** Sequences whose block tables begin with the same
//! physical blocks (the rules every agent shares, which the prefix cache computed once) would
//! each stream those keys and values from memory again: with 64 agents, 64 times per layer. So
//! the queries of all of them are stacked, per kv head, and scored against the shared keys in
//! one pass (a matrix product whose keys stay in the core's cache), and weigh the shared values
//! in one pass the same way; each item does the rest of its context alone. A step then runs in
//! four phases:
//!
//! 1. shared scores, per tile of stacked queries;
//! 2. each item's own scores, then its softmax over the whole row;
//! 3. shared values, per tile;
//! 4. each item's own values, added after the shared ones, and the normalisation.
//!
//! An item with no shared prefix does 2 and 4 in one task. Unlike FlashInfer's cascade, which
//! merges two partial softmaxes by their log-sum-exp, the row of scores is kept whole: every
//! score is the same dot product, the softmax runs over the same row, and the weighted values
//! are added in position order whether a query was stacked or alone. So where the split falls
//! (which depends on what else is in the batch) changes how often memory is read, never a bit
//! of the result: the kernel stays batch invariant, and equals itself without the cascade bit
//! for bit.

#[cfg(target_arch = "x86_64")]
use super::kernels::{Avx2, Avx512};
use super::kernels::{Kernels, Portable, axpy, weigh_values_blocked};
use super::{Heads, SeqSpan};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::ops::Range;

/// Query rows per work item: small enough to spread a long prefill over every core.
pub(super) const ROWS_PER_ITEM: usize = 16;

/// Stacked queries per shared-prefix task: enough that a prefix's keys are read from memory
/// once for many sequences, few enough that the tasks spread over every core.
const TILE_QUERIES: usize = 32;

pub(super) fn cpu_f32(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    // Contiguous f32 CPU tensors flatten without copying the storage twice.
    t.flatten_all()?.to_vec1::<f32>()
}

/// Widest head the kernel converts f16 rows for, on the stack.
const MAX_HEAD_DIM: usize = 256;

/// A layer's keys or values, `(slots, kv_heads * head_dim)`, in the cache's format.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rows<'a> {
    F32(&'a [f32]),
    /// Half the bytes to read; every value widens to f32 exactly.
    F16(&'a [half::f16]),
}

fn with_rows<R>(t: &Tensor, f: impl FnOnce(Rows<'_>) -> R) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(cpu), Some((lo, hi))) => match t.dtype() {
            DType::F32 => Ok(f(Rows::F32(&cpu.as_slice::<f32>()?[lo..hi]))),
            DType::F16 => Ok(f(Rows::F16(&cpu.as_slice::<half::f16>()?[lo..hi]))),
            other => {
                candle_core::bail!("the paged CPU kernel reads f32 or f16 caches, not {other:?}")
            }
        },
        _ => candle_core::bail!("paged attention needs contiguous CPU tensors"),
    }
}

/// Sequences of a batch whose block tables begin with the same blocks, every one of them
/// wholly before the sequences' first queries (so every query sees all of it).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SharedPrefix {
    /// The shared leading blocks.
    pub blocks: Vec<u32>,
    /// The spans that begin with them.
    pub members: Vec<usize>,
}

/// The shared prefixes of a batch: sequences grouped by their first block, each group's
/// prefix the blocks all its members have in common. A sliding window would hide part of a
/// prefix from some queries, so windowed models (Mistral v0.1) attend without a cascade.
fn shared_prefixes(
    spans: &[SeqSpan],
    block_size: usize,
    window: Option<usize>,
) -> Vec<SharedPrefix> {
    if window.is_some() {
        return Vec::new();
    }
    let before_queries = |span: &SeqSpan| (span.start / block_size).min(span.blocks.len());
    let mut by_first: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (s, span) in spans.iter().enumerate() {
        if before_queries(span) > 0 {
            by_first.entry(span.blocks[0]).or_default().push(s);
        }
    }
    by_first
        .into_values()
        .filter(|members| members.len() >= 2)
        .map(|members| {
            let first = &spans[members[0]];
            let limit = members
                .iter()
                .map(|&s| before_queries(&spans[s]))
                .min()
                .unwrap_or(0);
            let len = (0..limit)
                .take_while(|&b| {
                    members
                        .iter()
                        .all(|&s| spans[s].blocks[b] == first.blocks[b])
                })
                .count();
            SharedPrefix {
                blocks: first.blocks[..len].to_vec(),
                members,
            }
        })
        .collect()
}

/// One kv head of one sequence (or of a shared prefix), read in place from the cache.
pub(super) struct PagedKv<'a> {
    pub k: Rows<'a>,
    pub v: Rows<'a>,
    pub blocks: &'a [u32],
    pub block_size: usize,
    pub heads: Heads,
    pub kvh: usize,
}

impl PagedKv<'_> {
    /// Calls `f(pos, key_or_value_row)` for positions `from..to` in order, walking the block
    /// table instead of dividing per position.
    #[inline(always)]
    pub(crate) fn for_each_row<K: Kernels + ?Sized>(
        &self,
        cache: Rows<'_>,
        from: usize,
        to: usize,
        mut f: impl FnMut(usize, &[f32]),
    ) {
        let d = self.heads.head_dim;
        match cache {
            Rows::F32(cache) => self.walk(
                from,
                to,
                #[inline(always)]
                |at| prefetch(cache, at, d),
                #[inline(always)]
                |pos, at| f(pos, &cache[at..at + d]),
            ),
            Rows::F16(cache) => {
                let mut row = [0f32; MAX_HEAD_DIM];
                let row = &mut row[..d];
                self.walk(
                    from,
                    to,
                    #[inline(always)]
                    |at| prefetch(cache, at, d),
                    #[inline(always)]
                    |pos, at| {
                        K::widen(&cache[at..at + d], row);
                        f(pos, row)
                    },
                )
            }
        }
    }

    /// Calls `f(pos, offset of its row)` for positions `from..to` in order, and `ahead(offset)`
    /// for the rows of the next block that `to` reaches, one beside each row of this block.
    ///
    /// Why the look-ahead: a block is a few kilobytes somewhere in the cache, so the CPU's
    /// prefetcher, which follows a stream within a page, starts each block on a miss; asking
    /// for the next block while this one is computed hides that wait (a sequence's own
    /// context is read from memory once per layer, and is most of what attention reads).
    #[inline(always)]
    fn walk(
        &self,
        from: usize,
        to: usize,
        mut ahead: impl FnMut(usize),
        mut f: impl FnMut(usize, usize),
    ) {
        let stride = self.heads.num_kv_heads * self.heads.head_dim;
        let bs = self.block_size;
        let base_of = |block: u32| block as usize * bs * stride + self.kvh * self.heads.head_dim;
        for (b, &block) in self.blocks.iter().enumerate().skip(from / bs) {
            let first = b * bs;
            if first >= to {
                break;
            }
            // Row `o` of the next block is asked for beside row `o` of this one, which spreads
            // the requests over the block.
            let (next, next_rows) = match self.blocks.get(b + 1) {
                Some(&next) if first + bs < to => (base_of(next), bs.min(to - first - bs)),
                _ => (0, 0),
            };
            let base = base_of(block);
            for o in from.saturating_sub(first)..bs.min(to - first) {
                if o < next_rows {
                    ahead(next + o * stride);
                }
                f(first + o, base + o * stride);
            }
        }
    }
}

/// Asks the CPU to bring the `d` values of `rows` at `at` into its caches (a hint: nothing
/// is read, and an address past the end is never touched).
#[inline(always)]
fn prefetch<T>(rows: &[T], at: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    if at + d <= rows.len() {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let bytes = d * std::mem::size_of::<T>();
        let row = rows[at..].as_ptr().cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch reads nothing and faults on no address; the row is in
            // bounds anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(line)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, at, d);
}

/// The instruction set the kernel's inner loops are compiled for, chosen once per call; all
/// give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The widest this CPU has (within `THRONG_MAX_CPU_ISA`, [`crate::model::cpu`]).
    pub fn best() -> Self {
        use crate::model::cpu::{CPU, Isa as Cpu};
        match CPU.isa {
            #[cfg(target_arch = "x86_64")]
            Cpu::Avx512 => Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            Cpu::Avx2 => Isa::Avx2,
            _ => Isa::Portable,
        }
    }

    /// Every one this CPU has (for tests).
    #[cfg(test)]
    pub fn available() -> Vec<Self> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
            all.push(Isa::Avx2);
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512f") {
            all.push(Isa::Avx512);
        }
        all
    }

    fn run(self, x: &Inputs<'_>, task: Task<'_, '_>) {
        match self {
            Isa::Portable => run::<Portable>(x, task),
            // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only made where the CPU has them.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { run_avx2(x, task) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { run_avx512(x, task) },
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn run_avx2(x: &Inputs<'_>, task: Task<'_, '_>) {
    run::<Avx2>(x, task)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn run_avx512(x: &Inputs<'_>, task: Task<'_, '_>) {
    run::<Avx512>(x, task)
}

/// What every task reads.
struct Inputs<'a> {
    /// Packed queries `(T, heads, head_dim)`.
    q: &'a [f32],
    k: Rows<'a>,
    v: Rows<'a>,
    spans: &'a [SeqSpan],
    block_size: usize,
    heads: Heads,
    window: Option<usize>,
}

impl<'a> Inputs<'a> {
    fn kv(&self, blocks: &'a [u32], kvh: usize) -> PagedKv<'a> {
        PagedKv {
            k: self.k,
            v: self.v,
            blocks,
            block_size: self.block_size,
            heads: self.heads,
            kvh,
        }
    }

    /// The item's queries, row by row and each row's heads of the item's kv group in order.
    fn queries(&self, item: &Item<'_>) -> impl Iterator<Item = &'a [f32]> + use<'a> {
        let (h, d, g) = (
            self.heads.num_heads,
            self.heads.head_dim,
            self.heads.group(),
        );
        let q_start = self.spans[item.span].q_start;
        let (q, kvh) = (self.q, item.kvh);
        item.rows
            .clone()
            .flat_map(move |r| (0..g).map(move |gi| ((q_start + r) * h + kvh * g + gi) * d))
            .map(move |at| &q[at..at + d])
    }
}

/// Query rows `rows` of span `span`, all heads of kv head `kvh`'s group, and its working
/// memory (slices of one scratch buffer that the layers of a forward pass reuse).
struct Item<'s> {
    span: usize,
    kvh: usize,
    rows: Range<usize>,
    /// Keys `0..shared` are the span's shared prefix, read by a tile of stacked queries.
    shared: usize,
    /// Keys the first query sees; query `i` sees `first_visible + i / group`.
    first_visible: usize,
    /// Keys the last query sees: the length of a row of `scores`.
    ctx: usize,
    /// One row per query: its scores, then its softmax weights, over positions `0..ctx`.
    /// Left from an earlier layer until written: every position a query sees is written
    /// before it is read.
    scores: &'s mut [f32],
    /// Each query's sum of weights.
    norms: Vec<f32>,
    /// One row of `head_dim` per query, zero before the first phase that adds to it.
    out: &'s mut [f32],
}

/// Where an item sits, before its working memory is handed out.
#[derive(Debug)]
struct Layout {
    span: usize,
    kvh: usize,
    rows: Range<usize>,
    shared: usize,
    /// Floats of its scores and of its output.
    scores_len: usize,
    out_len: usize,
}

impl Layout {
    fn new(
        spans: &[SeqSpan],
        heads: Heads,
        span: usize,
        kvh: usize,
        rows: Range<usize>,
        shared: usize,
    ) -> Self {
        let n = rows.len() * heads.group();
        let ctx = spans[span].start + rows.end;
        Self {
            span,
            kvh,
            rows,
            shared,
            scores_len: n * ctx,
            out_len: n * heads.head_dim,
        }
    }
}

/// A batch cut into items and tiles, with its shared prefixes: the same for every layer of a
/// forward pass, so worked out once per pass.
#[derive(Debug)]
pub(crate) struct BatchTiling {
    shared: Vec<SharedPrefix>,
    /// Items of shared prefixes first, each prefix's per kv head in a run cut into tiles.
    layout: Vec<Layout>,
    /// Runs of `layout` and the prefix they share.
    tiles: Vec<(Range<usize>, usize)>,
    /// Items `..with_prefix` have a shared prefix.
    with_prefix: usize,
    scores_len: usize,
    out_len: usize,
}

impl BatchTiling {
    /// The plan of `spans`, with their shared prefixes if `cascade`.
    pub fn new(
        spans: &[SeqSpan],
        block_size: usize,
        heads: Heads,
        window: Option<usize>,
        cascade: bool,
    ) -> Self {
        let shared = if cascade {
            shared_prefixes(spans, block_size, window)
        } else {
            Vec::new()
        };
        let g = heads.group();
        let row_chunks = |span: &SeqSpan| {
            let len = span.q_len;
            (0..len)
                .step_by(ROWS_PER_ITEM)
                .map(move |r0| r0..(r0 + ROWS_PER_ITEM).min(len))
        };
        let mut layout = Vec::new();
        let mut tiles: Vec<(Range<usize>, usize)> = Vec::new();
        let mut alone = vec![true; spans.len()];
        for (p, prefix) in shared.iter().enumerate() {
            let len = prefix.blocks.len() * block_size;
            for kvh in 0..heads.num_kv_heads {
                let mut start = layout.len();
                let mut stacked = 0;
                for &s in &prefix.members {
                    alone[s] = false;
                    for rows in row_chunks(&spans[s]) {
                        let queries = rows.len() * g;
                        if stacked > 0 && stacked + queries > TILE_QUERIES {
                            tiles.push((start..layout.len(), p));
                            (start, stacked) = (layout.len(), 0);
                        }
                        stacked += queries;
                        layout.push(Layout::new(spans, heads, s, kvh, rows, len));
                    }
                }
                if layout.len() > start {
                    tiles.push((start..layout.len(), p));
                }
            }
        }
        let with_prefix = layout.len();
        for (s, span) in spans.iter().enumerate().filter(|&(s, _)| alone[s]) {
            for kvh in 0..heads.num_kv_heads {
                layout.extend(
                    row_chunks(span).map(|rows| Layout::new(spans, heads, s, kvh, rows, 0)),
                );
            }
        }
        Self {
            scores_len: layout.iter().map(|at| at.scores_len).sum(),
            out_len: layout.iter().map(|at| at.out_len).sum(),
            shared,
            layout,
            tiles,
            with_prefix,
        }
    }
}

impl<'s> Item<'s> {
    fn new(at: &Layout, spans: &[SeqSpan], scores: &'s mut [f32], out: &'s mut [f32]) -> Self {
        let span = &spans[at.span];
        out.fill(0.0);
        Self {
            span: at.span,
            kvh: at.kvh,
            first_visible: span.start + at.rows.start + 1,
            ctx: span.start + at.rows.end,
            rows: at.rows.clone(),
            shared: at.shared,
            scores,
            norms: Vec::new(),
            out,
        }
    }
}

enum Task<'t, 's> {
    /// Phase 1: a tile's stacked queries against their shared prefix's keys.
    SharedScores(&'t mut [Item<'s>], &'t [u32]),
    /// Phase 2: an item's own keys and softmax; with `true`, its values too (phase 4), for
    /// an item with no shared prefix.
    Own(&'t mut Item<'s>, bool),
    /// Phase 3: a tile's weights against their shared prefix's values.
    SharedValues(&'t mut [Item<'s>], &'t [u32]),
    /// Phase 4: an item's own values and normalisation.
    OwnValues(&'t mut Item<'s>),
}

#[inline(always)]
fn run<K: Kernels>(x: &Inputs<'_>, task: Task<'_, '_>) {
    let g = x.heads.group();
    match task {
        Task::SharedScores(tile, blocks) => {
            let shared = tile[0].shared;
            let kv = x.kv(blocks, tile[0].kvh);
            let queries: Vec<&[f32]> = tile.iter().flat_map(|it| x.queries(it)).collect();
            let mut rows: Vec<&mut [f32]> = tile
                .iter_mut()
                .flat_map(|it| it.scores.chunks_exact_mut(it.ctx))
                .collect();
            score::<K>(&queries, &kv, 0, |_| shared, x.heads.scale(), &mut rows);
        }
        Task::Own(item, finish) => {
            let kv = x.kv(&x.spans[item.span].blocks, item.kvh);
            let queries: Vec<&[f32]> = x.queries(item).collect();
            let first = item.first_visible;
            let visible = |i: usize| first + i / g;
            let from = item.shared;
            let mut rows: Vec<&mut [f32]> = item.scores.chunks_exact_mut(item.ctx).collect();
            score::<K>(&queries, &kv, from, visible, x.heads.scale(), &mut rows);
            // Loops, not iterator adapters: closures are compiled apart from this function
            // and would lose its instruction set.
            let mut norms = Vec::with_capacity(rows.len());
            for (i, row) in rows.iter_mut().enumerate() {
                norms.push(softmax::<K>(&mut row[..visible(i)], x.window));
            }
            item.norms = norms;
            if finish {
                own_values::<K>(x, item);
            }
        }
        Task::SharedValues(tile, blocks) => {
            let shared = tile[0].shared;
            let kv = x.kv(blocks, tile[0].kvh);
            let d = x.heads.head_dim;
            let mut weights: Vec<&[f32]> = Vec::new();
            let mut out: Vec<&mut [f32]> = Vec::new();
            for Item {
                scores,
                out: o,
                ctx,
                ..
            } in tile.iter_mut()
            {
                weights.extend(scores.chunks_exact(*ctx));
                out.extend(o.chunks_exact_mut(d));
            }
            weigh::<K>(&kv, &weights, 0, |_| shared, &mut out);
        }
        Task::OwnValues(item) => own_values::<K>(x, item),
    }
}

/// Phase 4: values from the item's own keys on, added after the shared ones, then divided by
/// the weights' sums.
#[inline(always)]
fn own_values<K: Kernels>(x: &Inputs<'_>, item: &mut Item<'_>) {
    let kv = x.kv(&x.spans[item.span].blocks, item.kvh);
    let (g, d) = (x.heads.group(), x.heads.head_dim);
    let first = item.first_visible;
    let weights: Vec<&[f32]> = item.scores.chunks_exact(item.ctx).collect();
    let mut out: Vec<&mut [f32]> = item.out.chunks_exact_mut(d).collect();
    weigh::<K>(&kv, &weights, item.shared, |i| first + i / g, &mut out);
    for (row, norm) in out.iter_mut().zip(&item.norms) {
        let inv = 1.0 / norm;
        row.iter_mut().for_each(|x| *x *= inv);
    }
}

/// `scores[i][pos] = dot(queries[i], key[pos]) * scale` for `from <= pos < visible(i)`.
#[inline(always)]
fn score<K: Kernels>(
    queries: &[&[f32]],
    kv: &PagedKv<'_>,
    from: usize,
    visible: impl Fn(usize) -> usize,
    scale: f32,
    scores: &mut [&mut [f32]],
) {
    let n = queries.len();
    if n == 0 || K::score_blocked(queries, kv, from, &visible, scale, scores) {
        return;
    }
    let mut dots = vec![0f32; n];
    let mut first = 0;
    kv.for_each_row::<K>(
        kv.k,
        from,
        visible(n - 1),
        #[inline(always)]
        |pos, key| {
            while visible(first) <= pos {
                first += 1;
            }
            K::dots(&queries[first..], key, &mut dots[first..]);
            for i in first..n {
                scores[i][pos] = dots[i] * scale;
            }
        },
    );
}

/// `out[i] += sum over from <= pos < visible(i) of weights[i][pos] * value[pos]`, in position
/// order.
#[inline(always)]
fn weigh<K: Kernels>(
    kv: &PagedKv<'_>,
    weights: &[&[f32]],
    from: usize,
    visible: impl Fn(usize) -> usize,
    out: &mut [&mut [f32]],
) {
    let n = weights.len();
    if n == 0 {
        return;
    }
    match kv.heads.head_dim {
        64 => weigh_values_blocked::<K, 64, 4>(kv, weights, from, visible, out),
        128 => weigh_values_blocked::<K, 128, 2>(kv, weights, from, visible, out),
        _ => {
            let mut first = 0;
            kv.for_each_row::<K>(
                kv.v,
                from,
                visible(n - 1),
                #[inline(always)]
                |pos, value| {
                    while visible(first) <= pos {
                        first += 1;
                    }
                    for i in first..n {
                        axpy(out[i], weights[i][pos], value);
                    }
                },
            );
        }
    }
}

/// Turns a row of scores into weights `e^(score - max)`, in place, and returns their sum. Keys
/// before a sliding window get weight zero (adding zeros changes no sum).
#[inline(always)]
fn softmax<K: Kernels>(row: &mut [f32], window: Option<usize>) -> f32 {
    let first = window.map_or(0, |w| row.len().saturating_sub(w));
    // Sixteen running maxima: a maximum is the same whatever the order (scores are never
    // NaN), and one chain of dependent comparisons would take a cycle each.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = row[first..].chunks_exact(16);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &s) in lanes.iter_mut().zip(chunk) {
            *m = m.max(s);
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &m in lanes.iter().chain(rest) {
        max = max.max(m);
    }
    for s in row[first..].iter_mut() {
        *s = super::kernels::exp_nonpositive(*s - max);
    }
    row[..first].fill(0.0);
    K::sum(row)
}

/// Attends packed queries `q` `(T, heads, head_dim)` to the keys and values of `spans`' blocks
/// in `k_cache` and `v_cache` `(slots, kv_heads * head_dim)` as `plan` (made for these spans
/// and heads) cuts them, reading each shared prefix once per tile of stacked queries; returns
/// `(T, heads * head_dim)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    spans: &[SeqSpan],
    block_size: usize,
    heads: Heads,
    window: Option<usize>,
    plan: &BatchTiling,
    isa: Isa,
    scratch: &mut Vec<f32>,
) -> candle_core::Result<Tensor> {
    let (t, h, d) = q.dims3()?;
    let q = cpu_f32(&q.contiguous()?)?;
    let g = heads.group();
    // Every item's working memory, out of one buffer kept from layer to layer.
    let (scores_len, out_len) = (plan.scores_len, plan.out_len);
    if scratch.len() < scores_len + out_len {
        scratch.resize(scores_len + out_len, 0.0);
    }
    let (mut scores_rest, mut out_rest) = scratch[..scores_len + out_len].split_at_mut(scores_len);
    let mut items: Vec<Item<'_>> = Vec::with_capacity(plan.layout.len());
    for at in &plan.layout {
        let (sc, sr) = std::mem::take(&mut scores_rest).split_at_mut(at.scores_len);
        let (oc, or) = std::mem::take(&mut out_rest).split_at_mut(at.out_len);
        (scores_rest, out_rest) = (sr, or);
        items.push(Item::new(at, spans, sc, oc));
    }
    if d > MAX_HEAD_DIM && k_cache.dtype() == DType::F16 {
        candle_core::bail!(
            "the paged CPU kernel reads f16 heads of at most {MAX_HEAD_DIM} dimensions"
        );
    }
    with_rows(k_cache, |k| {
        with_rows(v_cache, |v| {
            let x = Inputs {
                q: &q,
                k,
                v,
                spans,
                block_size,
                heads,
                window,
            };
            let tiled = |items: &mut Vec<Item<'_>>, values: bool| {
                split_tiles(items, &plan.tiles)
                    .into_par_iter()
                    .for_each(|(tile, p)| {
                        let blocks = &plan.shared[p].blocks[..];
                        isa.run(
                            &x,
                            if values {
                                Task::SharedValues(tile, blocks)
                            } else {
                                Task::SharedScores(tile, blocks)
                            },
                        )
                    });
            };
            tiled(&mut items, false);
            items
                .par_iter_mut()
                .for_each(|it| isa.run(&x, Task::Own(it, it.shared == 0)));
            tiled(&mut items, true);
            items[..plan.with_prefix]
                .par_iter_mut()
                .for_each(|it| isa.run(&x, Task::OwnValues(it)));
        })
    })??;
    let mut out = vec![0f32; t * h * d];
    for item in &items {
        let span = &spans[item.span];
        for (i, r) in item.rows.clone().enumerate() {
            let dst = ((span.q_start + r) * h + item.kvh * g) * d;
            out[dst..dst + g * d].copy_from_slice(&item.out[i * g * d..(i + 1) * g * d]);
        }
    }
    Tensor::from_vec(out, (t, h * d), &Device::Cpu)
}

/// The tiles, as disjoint slices of `items` (the tiles are consecutive runs from the start).
fn split_tiles<'i, 's>(
    items: &'i mut [Item<'s>],
    tiles: &[(Range<usize>, usize)],
) -> Vec<(&'i mut [Item<'s>], usize)> {
    let mut rest = items;
    let mut at = 0;
    let mut out = Vec::with_capacity(tiles.len());
    for (range, p) in tiles {
        debug_assert_eq!(range.start, at, "tiles are consecutive");
        let (tile, tail) = std::mem::take(&mut rest).split_at_mut(range.len());
        out.push((tile, *p));
        rest = tail;
        at = range.end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    /// A ragged batch over one cache, and the kernel's output for it in every way it can run.
    struct Case {
        heads: Heads,
        block_size: usize,
        spans: Vec<SeqSpan>,
        q: Tensor,
        k: Tensor,
        v: Tensor,
    }

    impl Case {
        fn new(head_dim: usize, block_size: usize, blocks: usize, spans: Vec<SeqSpan>) -> Self {
            let heads = Heads {
                num_heads: 6,
                num_kv_heads: 2,
                head_dim,
            };
            let t: usize = spans.iter().map(|s| s.q_len).sum();
            let kv_width = heads.num_kv_heads * head_dim;
            let cache = |seed| {
                Tensor::from_vec(
                    random(blocks * block_size * kv_width, seed),
                    (blocks * block_size, kv_width),
                    &Device::Cpu,
                )
                .unwrap()
            };
            let q = Tensor::from_vec(
                random(t * heads.num_heads * head_dim, 11),
                (t, heads.num_heads, head_dim),
                &Device::Cpu,
            )
            .unwrap();
            Self {
                heads,
                block_size,
                q,
                k: cache(12),
                v: cache(13),
                spans,
            }
        }

        /// The same case with the cache stored in `dtype`.
        fn stored_as(&self, dtype: DType) -> Self {
            Self {
                k: self.k.to_dtype(dtype).unwrap(),
                v: self.v.to_dtype(dtype).unwrap(),
                q: self.q.clone(),
                spans: self.spans.clone(),
                ..*self
            }
        }

        fn attend(&self, window: Option<usize>, cascade: bool, isa: Isa) -> Vec<u32> {
            let plan = BatchTiling::new(&self.spans, self.block_size, self.heads, window, cascade);
            let out = attend(
                &self.q,
                &self.k,
                &self.v,
                &self.spans,
                self.block_size,
                self.heads,
                window,
                &plan,
                isa,
                &mut Vec::new(),
            )
            .unwrap();
            cpu_f32(&out).unwrap().iter().map(|x| x.to_bits()).collect()
        }
    }

    fn span(q_start: usize, q_len: usize, start: usize, blocks: &[u32]) -> SeqSpan {
        SeqSpan {
            q_start,
            q_len,
            start,
            blocks: blocks.to_vec(),
        }
    }

    /// Agents after shared rules: decodes and prefill chunks of sequences whose block tables
    /// begin with the same blocks (0, 1, 2 for four of them, 0, 1 for one more, 9 for two
    /// others), and one that shares nothing. Packed rows in order.
    fn agents(head_dim: usize) -> Case {
        let block_size = 16;
        let spans = vec![
            span(0, 1, 57, &[0, 1, 2, 3]),
            span(1, 1, 63, &[0, 1, 2, 4]),
            span(2, 20, 40, &[0, 1, 2, 5]),
            span(22, 1, 33, &[0, 1, 6]),
            span(23, 1, 50, &[0, 1, 2, 7]),
            span(24, 3, 20, &[9, 10]),
            span(27, 1, 31, &[9, 11]),
            span(28, 5, 4, &[12]),
        ];
        Case::new(head_dim, block_size, 13, spans)
    }

    #[test]
    fn shared_prefixes_are_the_common_leading_blocks_before_every_query() {
        let case = agents(8);
        let shared = shared_prefixes(&case.spans, case.block_size, None);
        assert_eq!(
            shared,
            vec![
                // The sequence at position 33 shares only blocks 0 and 1 with the others.
                SharedPrefix {
                    blocks: vec![0, 1],
                    members: vec![0, 1, 2, 3, 4],
                },
                // The prefill chunk at position 20 has only block 9 wholly before its queries.
                SharedPrefix {
                    blocks: vec![9],
                    members: vec![5, 6],
                },
            ]
        );
        assert!(
            shared_prefixes(&case.spans, case.block_size, Some(64)).is_empty(),
            "a sliding window attends without a cascade"
        );
    }

    /// The cascade reads memory differently and changes no bit: on every instruction set
    /// the CPU offers, for head sizes with register-blocked loops (64, 128) and without (24),
    /// on decodes and prefill chunks, with and without a window, from f32 and f16 caches.
    #[test]
    fn every_instruction_set_with_or_without_the_cascade_gives_the_portable_bits() {
        for (head_dim, dtype) in [24, 64, 128]
            .into_iter()
            .flat_map(|d| [(d, DType::F32), (d, DType::F16)])
        {
            let case = agents(head_dim).stored_as(dtype);
            for window in [None, Some(20)] {
                let portable = case.attend(window, false, Isa::Portable);
                for isa in Isa::available() {
                    for cascade in [false, true] {
                        assert!(
                            case.attend(window, cascade, isa) == portable,
                            "{isa:?}, cascade {cascade}, head_dim {head_dim}, {dtype:?}, window {window:?}"
                        );
                    }
                }
            }
        }
    }

    /// A sequence's rows do not depend on its company: alone (no prefix shared, so no
    /// cascade) and in batches where different partners share different parts of its prefix,
    /// at different packed positions, its output has the same bits.
    #[test]
    fn a_sequence_alone_and_in_any_batch_gives_the_same_bits() {
        let head_dim = 64;
        let me = |q_start| span(q_start, 2, 70, &[0, 1, 2, 3, 4]);
        let row_width = 6 * head_dim;
        let mine = |case: &Case, q_start: usize| {
            let out = case.attend(None, true, Isa::best());
            out[q_start * row_width..(q_start + 2) * row_width].to_vec()
        };
        let alone = Case::new(head_dim, 16, 20, vec![me(0)]);
        let expected = mine(&alone, 0);
        let batches = [
            vec![span(0, 1, 40, &[0, 1, 2, 9]), me(1)],
            vec![me(0), span(2, 1, 17, &[0, 10])],
            vec![
                span(0, 7, 33, &[0, 1, 2, 11]),
                span(7, 1, 90, &[0, 1, 2, 3, 4, 12]),
                me(8),
                span(10, 1, 3, &[13]),
            ],
            (0..12)
                .map(|i| span(i, 1, 64 + i, &[0, 1, 2, 3, 14 + i as u32 / 2]))
                .chain([me(12)])
                .collect(),
        ];
        for (b, spans) in batches.into_iter().enumerate() {
            let at = spans
                .iter()
                .position(|s| s.q_len == 2 && s.start == 70)
                .unwrap();
            let q_start = spans[at].q_start;
            let case = Case {
                // Same cache contents and the same queries for `me` at its place.
                ..Case::new(head_dim, 16, 20, spans)
            };
            let mut case = case;
            let q_alone = alone.q.narrow(0, 0, 2).unwrap();
            let t = case.q.dim(0).unwrap();
            let before = case.q.narrow(0, 0, q_start).unwrap();
            let after = case.q.narrow(0, q_start + 2, t - q_start - 2).unwrap();
            case.q = Tensor::cat(&[&before, &q_alone, &after], 0).unwrap();
            assert!(
                !shared_prefixes(&case.spans, 16, None).is_empty(),
                "batch {b} shares a prefix"
            );
            assert!(mine(&case, q_start) == expected, "batch {b}");
        }
    }

    /// A window of `w` keys gives the same attention as the full context cut to its last
    /// `w` positions: the window drops what lies before it and nothing else.
    #[test]
    fn a_sliding_window_sees_exactly_its_last_keys() {
        let heads = Heads {
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 8,
        };
        let block_size = 4;
        let q = Tensor::from_vec(random(16, 1), (1, 2, 8), &Device::Cpu).unwrap();
        let k = Tensor::from_vec(random(96, 2), (12, 8), &Device::Cpu).unwrap();
        let v = Tensor::from_vec(random(96, 3), (12, 8), &Device::Cpu).unwrap();
        // A decode at position 9 with a window of 4 sees positions 6..=9, which are the
        // last four rows of the blocks [0, 1, 2]: block 1 offsets 2, 3 and block 2 offsets 0, 1.
        let windowed = span(0, 1, 9, &[0, 1, 2]);
        let got = attend(
            &q,
            &k,
            &v,
            std::slice::from_ref(&windowed),
            block_size,
            heads,
            Some(4),
            &BatchTiling::new(
                std::slice::from_ref(&windowed),
                block_size,
                heads,
                Some(4),
                false,
            ),
            Isa::best(),
            &mut Vec::new(),
        )
        .unwrap();
        // The same four keys copied to the front of a fresh cache, seen in full.
        let rows = Tensor::new(&[6u32, 7, 8, 9], &Device::Cpu).unwrap();
        let (k4, v4) = (
            k.index_select(&rows, 0).unwrap(),
            v.index_select(&rows, 0).unwrap(),
        );
        let full = span(0, 1, 3, &[0]);
        let expected = attend(
            &q,
            &k4,
            &v4,
            std::slice::from_ref(&full),
            block_size,
            heads,
            None,
            &BatchTiling::new(std::slice::from_ref(&full), block_size, heads, None, false),
            Isa::best(),
            &mut Vec::new(),
        )
        .unwrap();
        let diff = (got - expected)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-6, "max difference {diff}");
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// `cargo test --release --lib attention::paged::timing -- --ignored --nocapture`: the
    /// decode step of 64 agents after 250 shared tokens, 30 layers each with its own cache,
    /// with and without the cascade (`THRONG_TIMING=plain|cascade` runs one only, for perf).
    #[test]
    #[ignore]
    fn decode_of_64_agents() {
        let heads = Heads {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
        };
        let bs = 16;
        let agents = 64;
        let layers = 30;
        let blocks_from = |var: &str, default: usize| {
            std::env::var(var)
                .ok()
                .and_then(|b| b.parse().ok())
                .unwrap_or(default)
        };
        let shared_blocks = blocks_from("THRONG_TIMING_SHARED_BLOCKS", 15);
        // About 100 tokens of each agent's own (one decision); `THRONG_TIMING_OWN_BLOCKS=85`
        // is the history workload's tenth step (some 1,360 tokens of its own).
        let own_blocks = blocks_from("THRONG_TIMING_OWN_BLOCKS", 7);
        let blocks = shared_blocks + agents * own_blocks;
        let width = heads.num_kv_heads * heads.head_dim;
        let data = |n: usize, seed: usize| {
            (0..n)
                .map(|i| (((i + seed) * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect::<Vec<f32>>()
        };
        let caches: Vec<(Tensor, Tensor)> = (0..layers)
            .map(|l| {
                let t = |s| {
                    Tensor::from_vec(
                        data(blocks * bs * width, s),
                        (blocks * bs, width),
                        &Device::Cpu,
                    )
                    .unwrap()
                };
                (t(2 * l), t(2 * l + 1))
            })
            .collect();
        // The CPU's cache is f16 by default (`KvFormat::Auto`); `THRONG_TIMING_KV=f32` times
        // an f32 cache.
        let caches: Vec<(Tensor, Tensor)> = match std::env::var("THRONG_TIMING_KV").as_deref() {
            Ok("f32") => caches,
            _ => caches
                .into_iter()
                .map(|(k, v)| {
                    (
                        k.to_dtype(DType::F16).unwrap(),
                        v.to_dtype(DType::F16).unwrap(),
                    )
                })
                .collect(),
        };
        let spans: Vec<SeqSpan> = (0..agents)
            .map(|a| SeqSpan {
                q_start: a,
                q_len: 1,
                start: (shared_blocks + own_blocks) * bs - 10 + a % 10,
                blocks: (0..shared_blocks as u32)
                    .chain((0..own_blocks).map(|o| (shared_blocks + a * own_blocks + o) as u32))
                    .collect(),
            })
            .collect();
        let q = Tensor::from_vec(data(agents * 9 * 64, 0), (agents, 9, 64), &Device::Cpu).unwrap();
        let plans = [false, true].map(|cascade| BatchTiling::new(&spans, bs, heads, None, cascade));
        let only = std::env::var("THRONG_TIMING").ok();
        let mut scratch = Vec::new();
        let mut best = [f64::INFINITY; 2];
        for _ in 0..15 {
            for (m, plan) in plans.iter().enumerate() {
                if only
                    .as_deref()
                    .is_some_and(|o| o != ["plain", "cascade"][m])
                {
                    continue;
                }
                let t = std::time::Instant::now();
                crate::model::llama::on_busy_pool(|| {
                    for (k, v) in &caches {
                        let isa = Isa::best();
                        attend(&q, k, v, &spans, bs, heads, None, plan, isa, &mut scratch).unwrap();
                    }
                });
                best[m] = best[m].min(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        println!(
            "best of 15, ms per step of {layers} layers: plain {:.2}, cascade {:.2}",
            best[0], best[1]
        );
    }
}
