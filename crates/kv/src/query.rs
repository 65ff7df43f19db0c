//! Queries: a point get by key, a key range, or a range of an indexed
//! (or any) field. As JSON: `{"get": 42}`, `{"keys": {"ge": 10, "lt":
//! 20}}`, `{"where": {"field": "energy", "gt": 3.5}}`. Every query is
//! turned into a closed range of ordinals (`schema::ordinals`) of one
//! column, so the same code prunes a table's batches and filters rows.

use crate::schema::{ordinal_f64, ordinal_i64, FieldType, SpaceSchema};
use crate::KvError;
use arrow_array::{BooleanArray, RecordBatch};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Query {
    Get(u64),
    /// A key range (no `field`).
    Keys(Bound),
    /// A range of `field`.
    Where(Bound),
    /// Every record.
    All,
}

/// Bounds on a value, each optional: `{"gt": 3.5, "le": 10}`; in a
/// `where`, with the field they bound.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bound {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gt: Option<serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ge: Option<serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lt: Option<serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub le: Option<serde_json::Number>,
}

/// What a query found.
#[derive(Debug, Default)]
pub struct QueryResult {
    pub batches: Vec<RecordBatch>,
    /// Whether a sorted table answered it (else every record was read).
    pub indexed: bool,
    /// Bytes of the frames of every batch it went through: read from the
    /// volume, or found in the batch cache.
    pub frame_bytes: u64,
    /// Of those, the bytes found in the batch cache.
    pub cached_bytes: u64,
}

impl QueryResult {
    pub fn rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }

    /// Counts a frame of `bytes` gone through, found in the cache or not.
    pub(crate) fn count(&mut self, bytes: u64, cached: bool) {
        self.frame_bytes += bytes;
        if cached {
            self.cached_bytes += bytes;
        }
    }
}

/// A query as a column and a closed range of its ordinals (`None`: it
/// matches nothing).
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub column: String,
    pub range: Option<(u64, u64)>,
}

impl Plan {
    pub fn of(query: &Query, schema: &SpaceSchema) -> Result<Plan, KvError> {
        let (column, bound) = match query {
            Query::Get(key) => {
                return Ok(Plan {
                    column: schema.key.clone(),
                    range: Some((*key, *key)),
                })
            }
            Query::All => {
                return Ok(Plan {
                    column: schema.key.clone(),
                    range: Some((0, u64::MAX)),
                })
            }
            Query::Keys(bound) => match &bound.field {
                None => (schema.key.as_str(), bound),
                Some(_) => return bad("a key range names no field: use where"),
            },
            Query::Where(bound) => match &bound.field {
                Some(field) => (field.as_str(), bound),
                None => return bad("where names the field it bounds"),
            },
        };
        let kind = schema
            .field(column)
            .ok_or_else(|| KvError::BadQuery {
                why: format!("no field {column:?}"),
            })?
            .kind;
        let lower = match (&bound.gt, &bound.ge) {
            (Some(_), Some(_)) => return bad("both gt and ge"),
            (Some(n), None) => Some((number(n)?, false)),
            (None, Some(n)) => Some((number(n)?, true)),
            (None, None) => None,
        };
        let upper = match (&bound.lt, &bound.le) {
            (Some(_), Some(_)) => return bad("both lt and le"),
            (Some(n), None) => Some((number(n)?, false)),
            (None, Some(n)) => Some((number(n)?, true)),
            (None, None) => None,
        };
        Ok(Plan {
            column: column.to_string(),
            range: ordinal_range(kind, lower, upper),
        })
    }

    /// Which rows of `batch` match.
    pub fn matches(&self, batch: &RecordBatch, column: usize) -> BooleanArray {
        let (lo, hi) = self.range.unwrap_or((1, 0));
        let ords = crate::schema::ordinals(batch.column(column).as_ref());
        ords.iter().map(|&o| Some(lo <= o && o <= hi)).collect()
    }
}

fn bad<T>(why: &str) -> Result<T, KvError> {
    Err(KvError::BadQuery { why: why.to_string() })
}

/// A bound's value, exact for integers.
#[derive(Clone, Copy, Debug)]
enum Value {
    Int(i128),
    Float(f64),
}

fn number(n: &serde_json::Number) -> Result<Value, KvError> {
    if let Some(v) = n.as_u64() {
        Ok(Value::Int(i128::from(v)))
    } else if let Some(v) = n.as_i64() {
        Ok(Value::Int(i128::from(v)))
    } else {
        match n.as_f64() {
            Some(v) if v.is_finite() => Ok(Value::Float(v)),
            _ => bad("a bound is a finite number"),
        }
    }
}

/// The closed range of ordinals of a `kind` column that the bounds
/// (value, inclusive) admit.
fn ordinal_range(kind: FieldType, lower: Option<(Value, bool)>, upper: Option<(Value, bool)>) -> Option<(u64, u64)> {
    match kind {
        FieldType::F32 | FieldType::F64 => {
            let float = |v: Value| match v {
                Value::Int(i) => i as f64,
                Value::Float(f) => f,
            };
            // NaNs lie past the infinities: no finite bound reaches them.
            let lo = match lower {
                None => ordinal_f64(f64::NEG_INFINITY),
                Some((v, true)) => ordinal_f64(float(v)),
                Some((v, false)) => ordinal_f64(float(v)).checked_add(1)?,
            };
            let hi = match upper {
                None => ordinal_f64(f64::INFINITY),
                Some((v, true)) => ordinal_f64(float(v)),
                Some((v, false)) => ordinal_f64(float(v)).checked_sub(1)?,
            };
            (lo <= hi).then_some((lo, hi))
        }
        _ => {
            let (min, max): (i128, i128) = match kind {
                FieldType::U64 => (0, u64::MAX.into()),
                FieldType::I64 => (i64::MIN.into(), i64::MAX.into()),
                FieldType::U32 => (0, u32::MAX.into()),
                _ => (i32::MIN.into(), i32::MAX.into()),
            };
            // Integer bounds, inclusive: x > 3.5 is x >= 4.
            let lo = match lower {
                None => min,
                Some((Value::Int(i), true)) => i,
                Some((Value::Int(i), false)) => i + 1,
                Some((Value::Float(f), true)) => f.ceil() as i128,
                Some((Value::Float(f), false)) => f.floor() as i128 + 1,
            }
            .max(min);
            let hi = match upper {
                None => max,
                Some((Value::Int(i), true)) => i,
                Some((Value::Int(i), false)) => i - 1,
                Some((Value::Float(f), true)) => f.floor() as i128,
                Some((Value::Float(f), false)) => f.ceil() as i128 - 1,
            }
            .min(max);
            if lo > hi {
                return None;
            }
            let ordinal = |v: i128| match kind {
                FieldType::U64 | FieldType::U32 => v as u64,
                _ => ordinal_i64(v as i64),
            };
            Some((ordinal(lo), ordinal(hi)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> SpaceSchema {
        serde_json::from_str(
            r#"{"key":"id","fields":[{"name":"id","type":"u64"},{"name":"e","type":"f32"},{"name":"q","type":"i32"}]}"#,
        )
        .unwrap()
    }

    fn plan(json: &str) -> Result<Plan, KvError> {
        Plan::of(&serde_json::from_str(json).unwrap(), &schema())
    }

    #[test]
    fn bounds_become_closed_ordinal_ranges() {
        assert_eq!(plan(r#"{"get":7}"#).unwrap().range, Some((7, 7)));
        assert_eq!(plan(r#"{"keys":{"ge":3,"lt":9}}"#).unwrap().range, Some((3, 8)));
        assert_eq!(plan(r#"{"keys":{"gt":3.5,"le":9.9}}"#).unwrap().range, Some((4, 9)));
        assert_eq!(plan(r#"{"keys":{"lt":0}}"#).unwrap().range, None);
        let q = plan(r#"{"where":{"field":"q","ge":-2,"le":2}}"#).unwrap();
        assert_eq!(q.range, Some((ordinal_i64(-2), ordinal_i64(2))));
        let e = plan(r#"{"where":{"field":"e","gt":3.5}}"#).unwrap();
        assert_eq!(e.range, Some((ordinal_f64(3.5) + 1, ordinal_f64(f64::INFINITY))));
        assert!(plan(r#"{"where":{"field":"zz","gt":1}}"#).is_err());
        assert!(plan(r#"{"keys":{"gt":1,"ge":2}}"#).is_err());
        assert!(plan(r#"{"keys":{"field":"e","gt":1}}"#).is_err());
        assert!(plan(r#"{"where":{"gt":1}}"#).is_err());
        assert!(serde_json::from_str::<Query>(r#"{"keys":{"gt":1,"gx":2}}"#).is_err());
    }
}
