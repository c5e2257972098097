//! A record table's column read as plain values, whatever Arrow type it was written in: the
//! readers of run folders (reports, `throng serve`) share these.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_schema::DataType;

/// Every value of `column` as text, a missing one as `missing`; `None` for a column that has
/// no text form.
pub fn texts(column: &dyn Array, missing: &str) -> Option<Vec<String>> {
    let utf8 = arrow_cast::cast(column, &DataType::Utf8).ok()?;
    let s = utf8.as_string::<i32>();
    Some(
        (0..s.len())
            .map(|i| match s.is_valid(i) {
                true => s.value(i).to_string(),
                false => missing.to_string(),
            })
            .collect(),
    )
}

/// Every value of `column` as a whole number (keys: populations, replicates, steps, agents);
/// `None` for a column that is not numeric.
pub fn wholes(column: &dyn Array) -> Option<Vec<usize>> {
    let f = arrow_cast::cast(column, &DataType::Float64).ok()?;
    let f = f.as_primitive::<Float64Type>();
    Some(f.values().iter().map(|&v| v as usize).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{StringArray, UInt32Array};

    #[test]
    fn columns_read_as_text_and_whole_numbers_whatever_their_type() {
        let names = StringArray::from(vec![Some("a"), None]);
        assert_eq!(texts(&names, "-").unwrap(), ["a", "-"]);
        let steps = UInt32Array::from(vec![0, 3]);
        assert_eq!(wholes(&steps).unwrap(), [0, 3]);
        assert_eq!(texts(&steps, "").unwrap(), ["0", "3"]);
    }
}
