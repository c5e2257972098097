//! Tables from rows given as dicts, with the columns a Python scenario declares
//! (`columns = {"payoff": "float64", "kind": "str", "note": "str?"}`): the state rows and the
//! per-cell aggregates that a Rust scenario's types describe by themselves.

use arrow_array::builder::{
    BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder, LargeStringBuilder,
    UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, FieldRef, Schema};
use serde_json::Value;
use std::sync::Arc;
use throng::prelude::TableError;

/// The spellings of column types, and the Arrow type of each. Text is `LargeUtf8`, as serde
/// traces a Rust `String`, so that a Python scenario's tables equal its Rust twin's.
const TYPES: &[(&str, DataType)] = &[
    ("float64", DataType::Float64),
    ("float", DataType::Float64),
    ("float32", DataType::Float32),
    ("int64", DataType::Int64),
    ("int", DataType::Int64),
    ("int32", DataType::Int32),
    ("uint32", DataType::UInt32),
    ("uint64", DataType::UInt64),
    ("bool", DataType::Boolean),
    ("str", DataType::LargeUtf8),
];

/// A column from its declaration: a type of [`TYPES`], with `?` when it may be missing.
pub fn field(name: &str, spec: &str) -> Result<FieldRef, TableError> {
    let (ty, nullable) = match spec.strip_suffix('?') {
        Some(ty) => (ty, true),
        None => (spec, false),
    };
    let Some((_, data_type)) = TYPES.iter().find(|(n, _)| *n == ty.trim()) else {
        return Err(TableError(format!(
            "column `{name}`: unknown type `{spec}` (known: {}; add `?` for a column that may \
             be None)",
            TYPES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )));
    };
    Ok(Arc::new(Field::new(name, data_type.clone(), nullable)))
}

/// One column of `rows`, each row's value at the field's name.
fn column(field: &Field, rows: &[&serde_json::Map<String, Value>]) -> Result<ArrayRef, TableError> {
    let name = field.name();
    let bad = |v: &Value, what: &str| TableError(format!("column `{name}`: {v} is not {what}"));
    let missing = || {
        TableError(format!(
            "column `{name}` is None or missing in a row: declare it `{}?` to allow that",
            TYPES
                .iter()
                .find(|(_, t)| t == field.data_type())
                .map_or("", |(n, _)| n)
        ))
    };
    let values = rows.iter().map(|r| r.get(name).filter(|v| !v.is_null()));
    macro_rules! build {
        ($builder:ty, $convert:expr, $what:expr) => {{
            let mut b = <$builder>::with_capacity(rows.len());
            for v in values {
                match v {
                    Some(v) => b.append_value($convert(v).ok_or_else(|| bad(v, $what))?),
                    None if field.is_nullable() => b.append_null(),
                    None => return Err(missing()),
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    let integer = |v: &Value| {
        v.as_i64().or_else(|| {
            v.as_f64()
                .filter(|x| x.fract() == 0.0 && x.abs() < 9.0e15)
                .map(|x| x as i64)
        })
    };
    Ok(match field.data_type() {
        DataType::Float64 => build!(Float64Builder, |v: &Value| v.as_f64(), "a number"),
        DataType::Float32 => build!(
            Float32Builder,
            |v: &Value| v.as_f64().map(|x| x as f32),
            "a number"
        ),
        DataType::Int64 => build!(Int64Builder, integer, "an integer"),
        DataType::Int32 => build!(
            Int32Builder,
            |v: &Value| integer(v).and_then(|x| i32::try_from(x).ok()),
            "an integer of 32 bits"
        ),
        DataType::UInt32 => build!(
            UInt32Builder,
            |v: &Value| integer(v).and_then(|x| u32::try_from(x).ok()),
            "an integer from 0 to 2^32-1"
        ),
        DataType::UInt64 => build!(
            UInt64Builder,
            |v: &Value| v
                .as_u64()
                .or_else(|| integer(v).and_then(|x| u64::try_from(x).ok())),
            "a non-negative integer"
        ),
        DataType::Boolean => build!(BooleanBuilder, |v: &Value| v.as_bool(), "a bool"),
        DataType::LargeUtf8 => {
            let mut b = LargeStringBuilder::with_capacity(rows.len(), rows.len() * 8);
            for v in values {
                match v {
                    Some(Value::String(s)) => b.append_value(s),
                    Some(v) => return Err(bad(v, "a string")),
                    None if field.is_nullable() => b.append_null(),
                    None => return Err(missing()),
                }
            }
            Arc::new(b.finish())
        }
        other => unreachable!("invariant: TYPES holds every declared type, not {other}"),
    })
}

/// A table of `fields` from `rows` (dicts); a row's keys that are not declared are refused,
/// so that a typo is not silently dropped.
pub fn batch(fields: &[FieldRef], rows: &[Value]) -> Result<RecordBatch, TableError> {
    let mut maps = Vec::with_capacity(rows.len());
    for row in rows {
        let Value::Object(map) = row else {
            return Err(TableError(format!(
                "a row is a dict of its columns, not {row}"
            )));
        };
        if let Some(extra) = map.keys().find(|k| !fields.iter().any(|f| f.name() == *k)) {
            return Err(TableError(format!(
                "a row has `{extra}`, which is not one of the declared columns ({}): declare \
                 it, or leave it out",
                fields
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        maps.push(map);
    }
    let columns = fields
        .iter()
        .map(|f| column(f, &maps))
        .collect::<Result<Vec<_>, _>>()?;
    let schema = Arc::new(Schema::new(fields.to_vec()));
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows.len()));
    RecordBatch::try_new_with_options(schema, columns, &options)
        .map_err(|e| TableError(e.to_string()))
}
