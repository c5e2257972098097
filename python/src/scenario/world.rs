//! A world: any picklable Python object, pickled into checkpoints.

use super::*;

/// A Python scenario's world: any Python object; a checkpoint holds its pickle.
pub struct PyWorld(pub Py<PyAny>);

impl Serialize for PyWorld {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = Python::attach(|py| {
            py.import("pickle")?
                .call_method1("dumps", (self.0.bind(py),))?
                .extract()
        })
        .map_err(|e: PyErr| {
            serde::ser::Error::custom(format!(
                "the world cannot be pickled for the checkpoint: {e}; keep it to data pickle \
                 can write (dicts, lists, numbers, dataclasses)"
            ))
        })?;
        s.serialize_bytes(&bytes)
    }
}

impl<'de> Deserialize<'de> for PyWorld {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes: serde_bytes_owned::Bytes = Deserialize::deserialize(d)?;
        Python::attach(|py| {
            py.import("pickle")?
                .call_method1("loads", (pyo3::types::PyBytes::new(py, &bytes.0),))
                .map(|w| PyWorld(w.unbind()))
        })
        .map_err(|e| serde::de::Error::custom(format!("the checkpoint's world: {e}")))
    }
}

/// Bytes read back whether the format wrote them as bytes or as a sequence.
pub(super) mod serde_bytes_owned {
    use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

    pub struct Bytes(pub Vec<u8>);

    impl<'de> Deserialize<'de> for Bytes {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Bytes;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
                    Ok(Bytes(v.to_vec()))
                }
                fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Bytes, E> {
                    Ok(Bytes(v))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
                    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                    while let Some(b) = seq.next_element::<u8>()? {
                        out.push(b);
                    }
                    Ok(Bytes(out))
                }
            }
            d.deserialize_bytes(V)
        }
    }
}
