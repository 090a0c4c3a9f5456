//! LitData's `json` leaf (`serializers.py:JsonSerializer`): a compact tagged binary encoding of
//! lists and dicts (`_nested_dumps`), or plain JSON text from older writers (first byte > 0x20).
//! Non-finite floats become the strings `"nan"`, `"inf"`, `"-inf"`, as in the canonical JSON.

use serde_json::{Map, Number, Value as Json};

const JSON: u8 = 0;
const STRS: u8 = 1;
const I64S: u8 = 2;
const F64S: u8 = 3;
const BOOLS: u8 = 4;
const DICT: u8 = 5;
const RECS: u8 = 6;
const STR: u8 = 7;
const I64: u8 = 8;
const F64: u8 = 9;
const BOOL: u8 = 10;
const NONE: u8 = 11;
const REC_NONE: u8 = 0x10;
const REC_STR: u8 = 0x11;
const REC_I64: u8 = 0x12;
const REC_F64: u8 = 0x13;
const REC_BOOL: u8 = 0x14;
const MAX_DEPTH: usize = 128;

type R<T> = Result<T, String>;

/// Decodes a `json` leaf.
pub(crate) fn decode(raw: &[u8]) -> R<Json> {
    match raw.first() {
        Some(&tag) if tag <= 0x20 => Cursor { raw, pos: 0 }.value(0),
        _ => serde_json::from_slice(raw).map_err(|e| format!("json leaf: {e}")),
    }
}

fn float(v: f64) -> Json {
    match Number::from_f64(v) {
        Some(n) => Json::Number(n),
        None if v.is_nan() => Json::String("nan".into()),
        None if v > 0.0 => Json::String("inf".into()),
        None => Json::String("-inf".into()),
    }
}

struct Cursor<'a> {
    raw: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> R<&[u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.raw.len())
            .ok_or_else(|| {
                format!(
                    "json leaf: {n} bytes needed at offset {}, past the end",
                    self.pos
                )
            })?;
        let s = &self.raw[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> R<usize> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn i64(&mut self) -> R<i64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }

    fn f64(&mut self) -> R<f64> {
        Ok(f64::from_bits(self.i64()? as u64))
    }

    fn utf8(&mut self) -> R<String> {
        let n = self.u32()?;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| "json leaf: string is not UTF-8".into())
    }

    /// Checks that `n` items of at least `min` bytes each can follow, so a count never drives an
    /// allocation or a loop beyond the leaf.
    fn count(&mut self, min: usize) -> R<usize> {
        let n = self.u32()?;
        if n.saturating_mul(min) > self.raw.len() - self.pos {
            return Err(format!(
                "json leaf: {n} items cannot fit in the remaining bytes"
            ));
        }
        Ok(n)
    }

    fn value(&mut self, depth: usize) -> R<Json> {
        if depth > MAX_DEPTH {
            return Err("json leaf nests too deeply".into());
        }
        let tag = self.u8()?;
        Ok(match tag {
            JSON => {
                let n = self.u32()?;
                let text = self.take(n)?;
                serde_json::from_slice(text).map_err(|e| format!("json leaf: {e}"))?
            }
            STRS => {
                let n = self.count(4)?;
                Json::Array(
                    (0..n)
                        .map(|_| self.utf8().map(Json::String))
                        .collect::<R<_>>()?,
                )
            }
            I64S => {
                let n = self.count(8)?;
                Json::Array(
                    (0..n)
                        .map(|_| self.i64().map(Json::from))
                        .collect::<R<_>>()?,
                )
            }
            F64S => {
                let n = self.count(8)?;
                Json::Array((0..n).map(|_| self.f64().map(float)).collect::<R<_>>()?)
            }
            BOOLS => {
                let n = self.count(1)?;
                Json::Array(self.take(n)?.iter().map(|&b| Json::Bool(b != 0)).collect())
            }
            STR => Json::String(self.utf8()?),
            I64 => Json::from(self.i64()?),
            F64 => float(self.f64()?),
            BOOL => Json::Bool(self.u8()? != 0),
            NONE => Json::Null,
            DICT => {
                let n = self.count(5)?;
                let mut map = Map::new();
                for _ in 0..n {
                    let key = self.utf8()?;
                    let value = self.value(depth + 1)?;
                    map.insert(key, value);
                }
                Json::Object(map)
            }
            RECS => self.records()?,
            // `_nested_loads_at` hands anything else to `json.loads` of the whole leaf.
            _ => serde_json::from_slice(self.raw).map_err(|e| format!("json leaf: {e}"))?,
        })
    }

    fn records(&mut self) -> R<Json> {
        let rows = self.u32()?;
        let n_keys = self.count(4)?;
        let keys: Vec<String> = (0..n_keys).map(|_| self.utf8()).collect::<R<_>>()?;
        if keys.is_empty() && rows > 0 {
            return Err("json leaf: records without keys".into());
        }
        if rows.saturating_mul(keys.len()) > self.raw.len() - self.pos {
            return Err(format!(
                "json leaf: {rows} records cannot fit in the remaining bytes"
            ));
        }
        let mut out = Vec::new();
        for _ in 0..rows {
            let mut row = Map::new();
            for key in &keys {
                let value = match self.u8()? {
                    REC_NONE => Json::Null,
                    REC_STR => Json::String(self.utf8()?),
                    REC_I64 => Json::from(self.i64()?),
                    REC_F64 => float(self.f64()?),
                    REC_BOOL => Json::Bool(self.u8()? != 0),
                    other => return Err(format!("json leaf: unknown record tag {other}")),
                };
                row.insert(key.clone(), value);
            }
            out.push(Json::Object(row));
        }
        Ok(Json::Array(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decodes_tagged_values() {
        let mut b = vec![I64S, 2, 0, 0, 0];
        b.extend_from_slice(&5i64.to_le_bytes());
        b.extend_from_slice(&(-1i64).to_le_bytes());
        assert_eq!(decode(&b).unwrap(), json!([5, -1]));

        let mut d = vec![
            DICT, 1, 0, 0, 0, 1, 0, 0, 0, b'k', STRS, 1, 0, 0, 0, 2, 0, 0, 0,
        ];
        d.extend_from_slice(b"hi");
        assert_eq!(decode(&d).unwrap(), json!({"k": ["hi"]}));
        assert_eq!(decode(br#"{"a": [1, 2]}"#).unwrap(), json!({"a": [1, 2]}));
    }

    #[test]
    fn lying_counts_are_errors_not_allocations() {
        assert!(decode(&[STRS, 255, 255, 255, 255]).is_err());
        assert!(decode(&[RECS, 255, 255, 255, 255, 1, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode(&[DICT, 1, 0, 0, 0]).is_err());
        let deep: Vec<u8> = std::iter::repeat_n([DICT, 1, 0, 0, 0, 0, 0, 0, 0], 200)
            .flatten()
            .collect();
        assert!(decode(&deep).is_err());
    }
}
