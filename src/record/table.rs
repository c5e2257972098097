//! Tables as Arrow record batches: written to CSV (spelled as the `csv` crate spells serde
//! values: `ryu` floats, `itoa` integers, `true`/`false`, empty for null) and to Parquet, and
//! read back from Parquet.

use super::RecordError;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Writes `batch`'s rows to `writer` (its header first when `header`).
pub(crate) fn write_csv<W: Write>(
    writer: &mut csv::Writer<W>,
    batch: &RecordBatch,
    header: bool,
    path: &Path,
) -> Result<(), RecordError> {
    let bad = |e: csv::Error| RecordError::format(path, e);
    if header {
        writer
            .write_record(batch.schema().fields().iter().map(|f| f.name().as_str()))
            .map_err(bad)?;
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            // Dictionaries are written as their values.
            DataType::Dictionary(_, value) => arrow_cast::cast(c, value),
            _ => Ok(c.clone()),
        })
        .collect::<Result<_, _>>()
        .map_err(|e| RecordError::format(path, e))?;
    let mut fields: Vec<String> = vec![String::new(); columns.len()];
    for row in 0..batch.num_rows() {
        for (field, column) in fields.iter_mut().zip(&columns) {
            field.clear();
            format_cell(column.as_ref(), row, field).map_err(|e| RecordError::format(path, e))?;
        }
        writer.write_record(&fields).map_err(bad)?;
    }
    Ok(())
}

/// A column whose type has no CSV spelling here: a scenario's row type, not its data.
#[derive(Debug, thiserror::Error)]
#[error("cannot write a {0} column to CSV")]
struct NoCsvSpelling(DataType);

fn format_cell(column: &dyn Array, row: usize, out: &mut String) -> Result<(), NoCsvSpelling> {
    if column.is_null(row) {
        return Ok(());
    }
    let mut ryu = ryu::Buffer::new();
    let mut itoa = itoa::Buffer::new();
    macro_rules! int {
        ($t:ty) => {
            out.push_str(itoa.format(column.as_primitive::<$t>().value(row)))
        };
    }
    match column.data_type() {
        DataType::Boolean => out.push_str(if column.as_boolean().value(row) {
            "true"
        } else {
            "false"
        }),
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float32 => {
            let v = column.as_primitive::<Float32Type>().value(row);
            out.push_str(ryu.format(v))
        }
        DataType::Float64 => {
            let v = column.as_primitive::<Float64Type>().value(row);
            out.push_str(ryu.format(v))
        }
        DataType::Utf8 => out.push_str(column.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => out.push_str(column.as_string::<i64>().value(row)),
        other => return Err(NoCsvSpelling(other.clone())),
    }
    Ok(())
}

/// Writes `batches` (one schema) as one Parquet file.
pub(crate) fn write_parquet(path: &Path, batches: &[RecordBatch]) -> Result<(), RecordError> {
    let Some(first) = batches.first() else {
        return Ok(());
    };
    let file = File::create(path).map_err(|e| RecordError::io(path, e))?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, first.schema(), None)
        .map_err(|e| RecordError::format(path, e))?;
    for batch in batches {
        writer
            .write(batch)
            .map_err(|e| RecordError::format(path, e))?;
    }
    writer.close().map_err(|e| RecordError::format(path, e))?;
    Ok(())
}

/// Every batch of the Parquet file at `path`, refusing one that is not Parquet or is cut
/// short.
pub fn read_parquet(path: &Path) -> Result<Vec<RecordBatch>, RecordError> {
    let file = File::open(path).map_err(|e| RecordError::io(path, e))?;
    let corrupt = |e: &dyn std::fmt::Display| {
        RecordError::format(
            path,
            format!("not a readable Parquet file ({e}); it may be truncated or corrupt"),
        )
    };
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.with_batch_size(64 * 1024).build())
        .map_err(|e| corrupt(&e))?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| corrupt(&e))
}
