//! Guards the guessing game's records across restructures of the simulation layer (issue 18:
//! scenarios moved onto typed rows and a shared runner): the same config and seed must give
//! the same bytes as the code that produced these hashes (taken at 7aab079). A change that
//! alters the records on purpose updates the hashes in the same commit and says why there.

mod common;

// Guards against a restructure that reorders, retypes or recomputes the guessing game's
// columns (attributes, guesses, wins), its per-cell aggregates or its sampled decisions log.
#[test]
fn guessing_game_records_are_unchanged() {
    common::regression::check(
        "guess-regression.toml",
        &[
            (
                "state.parquet",
                "a6898a8bbde5642a6e8524f6b1618c970dd5e0ddb88b35dfc88e1cd4054a06bb",
            ),
            (
                "state.csv",
                "0ee9e629f43fe4c89b6dcf2a9df1c59a262cc0fd21afb41c1968949b362b246f",
            ),
            (
                "decisions.jsonl",
                "47226d73042117388514ea8fa9f202378f0bcca32e182206d53f706da6f6b5e7",
            ),
            (
                "aggregates.csv",
                "eaf05a17cb4391fa028bd0f9e1a0bf05a98ca3707e8d37f6003d8eae5871d375",
            ),
        ],
    );
}
