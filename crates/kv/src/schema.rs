//! A space's schema: a u64 key and typed value fields, which fields get
//! an index, and what to do with records that share a key. It is given as
//! JSON when a space is created, kept in the space's manifest, and is the
//! Arrow schema every inserted batch must have.

use crate::KvError;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Fields a schema may have, the key included.
pub const FIELDS_MAX: usize = 64;
/// A field's name is 1 to this many bytes.
pub const FIELD_NAME_BYTES_MAX: usize = 64;

/// The value types a field may have (all fixed-width, so a record's size
/// is known and a column sorts and compares without decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    U64,
    I64,
    U32,
    I32,
    F32,
    F64,
}

impl FieldType {
    pub fn arrow(self) -> DataType {
        match self {
            FieldType::U64 => DataType::UInt64,
            FieldType::I64 => DataType::Int64,
            FieldType::U32 => DataType::UInt32,
            FieldType::I32 => DataType::Int32,
            FieldType::F32 => DataType::Float32,
            FieldType::F64 => DataType::Float64,
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            FieldType::U64 | FieldType::I64 | FieldType::F64 => 8,
            FieldType::U32 | FieldType::I32 | FieldType::F32 => 4,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FieldType,
}

/// Records with the same key: all kept (a multimap, as simulation output
/// usually is), or only the one inserted last (a map: the sort keeps the
/// newest, as a put overwrites).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Duplicates {
    #[default]
    KeepAll,
    KeepLast,
}

/// `{"key": "id", "fields": [{"name": "id", "type": "u64"}, ...],
/// "indexes": ["energy"], "duplicates": "keep_all"}`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceSchema {
    /// The field records are sorted and looked up by: a u64.
    pub key: String,
    /// Every field, the key among them, in the order batches have them.
    pub fields: Vec<FieldSpec>,
    /// Fields queried by range: each gets a copy of the records sorted by
    /// it after `finalize`.
    #[serde(default)]
    pub indexes: Vec<String>,
    #[serde(default)]
    pub duplicates: Duplicates,
}

impl SpaceSchema {
    /// Checks the schema's own consistency.
    pub fn check(&self) -> Result<(), KvError> {
        let bad = |why: String| Err(KvError::BadSchema { why });
        if self.fields.is_empty() || self.fields.len() > FIELDS_MAX {
            return bad(format!(
                "a schema has 1 to {FIELDS_MAX} fields, not {}",
                self.fields.len()
            ));
        }
        for (i, f) in self.fields.iter().enumerate() {
            if f.name.is_empty() || f.name.len() > FIELD_NAME_BYTES_MAX || f.name.chars().any(char::is_control) {
                return bad(format!(
                    "field name {:?}: 1 to {FIELD_NAME_BYTES_MAX} bytes, no control characters",
                    f.name
                ));
            }
            if self.fields[..i].iter().any(|g| g.name == f.name) {
                return bad(format!("field {:?} is named twice", f.name));
            }
        }
        match self.field(&self.key) {
            None => return bad(format!("the key {:?} is not one of the fields", self.key)),
            Some(f) if f.kind != FieldType::U64 => {
                return bad(format!("the key {:?} must be u64, not {:?}", self.key, f.kind))
            }
            Some(_) => {}
        }
        for (i, name) in self.indexes.iter().enumerate() {
            if self.field(name).is_none() {
                return bad(format!("index on {name:?}, which is not a field"));
            }
            if *name == self.key {
                return bad(format!("{name:?} is the key: records are sorted by it already"));
            }
            if self.indexes[..i].contains(name) {
                return bad(format!("index on {name:?} is asked twice"));
            }
        }
        Ok(())
    }

    pub fn field(&self, name: &str) -> Option<&FieldSpec> {
        self.fields.iter().find(|f| f.name == name)
    }

    pub fn column_of(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    pub fn key_column(&self) -> usize {
        self.column_of(&self.key).expect("a checked schema has its key")
    }

    /// Bytes of one record's values.
    pub fn record_bytes(&self) -> usize {
        self.fields.iter().map(|f| f.kind.bytes()).sum()
    }

    /// The Arrow schema of the space's batches (no field nullable).
    pub fn arrow(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.fields
                .iter()
                .map(|f| Field::new(&f.name, f.kind.arrow(), false))
                .collect::<Vec<_>>(),
        ))
    }

    /// Checks that `batch` has this schema's fields, names and types in
    /// order, and no nulls; returns it with the space's own (non-nullable)
    /// schema, so that every stored batch says the same.
    pub fn conform(&self, batch: &RecordBatch) -> Result<RecordBatch, KvError> {
        self.conform_schema(&batch.schema())?;
        for (column, spec) in batch.columns().iter().zip(&self.fields) {
            if column.null_count() > 0 {
                return Err(nulls(&spec.name, column.null_count()));
            }
        }
        let columns: Vec<ArrayRef> = batch.columns().to_vec();
        RecordBatch::try_new(self.arrow(), columns).map_err(|e| KvError::SchemaMismatch { why: e.to_string() })
    }

    /// Checks that `theirs` has this schema's fields, names and types in
    /// order (nullability aside: nulls are refused batch by batch).
    pub fn conform_schema(&self, theirs: &Schema) -> Result<(), KvError> {
        let mismatch = |why: String| Err(KvError::SchemaMismatch { why });
        if theirs.fields().len() != self.fields.len() {
            return mismatch(format!(
                "the batch has {} columns, the space {}",
                theirs.fields().len(),
                self.fields.len()
            ));
        }
        for (field, spec) in theirs.fields().iter().zip(&self.fields) {
            if field.name() != &spec.name || *field.data_type() != spec.kind.arrow() {
                return mismatch(format!(
                    "column {:?} of type {} where the space has {:?} of type {}",
                    field.name(),
                    field.data_type(),
                    spec.name,
                    spec.kind.arrow()
                ));
            }
        }
        Ok(())
    }
}

/// The error for a column with nulls: a space's fields have none.
pub(crate) fn nulls(column: &str, count: usize) -> KvError {
    KvError::SchemaMismatch {
        why: format!("column {column:?} has {count} nulls"),
    }
}

/// A column's values as u64s whose unsigned order is the values' order:
/// what sorting, directories and range pruning work on, whatever the
/// type. Signed integers flip the sign bit; floats map to their total
/// order (-0.0 taken as 0.0, so that a range from 0.0 holds it; NaNs sort
/// past the infinities, and exact predicates leave them out).
pub fn ordinals(column: &dyn Array) -> Vec<u64> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    match column.data_type() {
        DataType::UInt64 => column.as_primitive::<UInt64Type>().values().to_vec(),
        DataType::UInt32 => column
            .as_primitive::<UInt32Type>()
            .values()
            .iter()
            .map(|&v| u64::from(v))
            .collect(),
        DataType::Int64 => column
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .map(|&v| ordinal_i64(v))
            .collect(),
        DataType::Int32 => column
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|&v| ordinal_i64(i64::from(v)))
            .collect(),
        DataType::Float64 => column
            .as_primitive::<Float64Type>()
            .values()
            .iter()
            .map(|&v| ordinal_f64(v))
            .collect(),
        DataType::Float32 => column
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|&v| ordinal_f64(f64::from(v)))
            .collect(),
        other => unreachable!("a checked schema has no {other} field"),
    }
}

pub fn ordinal_i64(v: i64) -> u64 {
    (v as u64) ^ (1 << 63)
}

pub fn ordinal_f64(v: f64) -> u64 {
    let bits = if v == 0.0 { 0 } else { v.to_bits() };
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_keep_each_type_s_order() {
        let floats = [f64::NEG_INFINITY, -3.5, -1e-300, -0.0, 0.0, 1e-300, 2.0, f64::INFINITY];
        let ords: Vec<u64> = floats.iter().map(|&v| ordinal_f64(v)).collect();
        for (w, v) in ords.windows(2).zip(floats.windows(2)) {
            assert!(w[0] <= w[1], "{v:?}");
            assert_eq!(w[0] == w[1], v[0] == v[1], "{v:?}");
        }
        let ints = [i64::MIN, -1, 0, 1, i64::MAX];
        assert!(ints.windows(2).all(|w| ordinal_i64(w[0]) < ordinal_i64(w[1])));
        assert!(ordinal_f64(f64::NAN) > ordinal_f64(f64::INFINITY));
    }

    #[test]
    fn bad_schemas_are_refused_with_their_reason() {
        let good: SpaceSchema = serde_json::from_str(
            r#"{"key":"id","fields":[{"name":"id","type":"u64"},{"name":"e","type":"f32"}],"indexes":["e"]}"#,
        )
        .unwrap();
        good.check().unwrap();
        let cases = [
            (
                r#"{"key":"x","fields":[{"name":"id","type":"u64"}]}"#,
                "not one of the fields",
            ),
            (r#"{"key":"id","fields":[{"name":"id","type":"f32"}]}"#, "must be u64"),
            (
                r#"{"key":"id","fields":[{"name":"id","type":"u64"},{"name":"id","type":"u32"}]}"#,
                "named twice",
            ),
            (
                r#"{"key":"id","fields":[{"name":"id","type":"u64"}],"indexes":["id"]}"#,
                "is the key",
            ),
            (
                r#"{"key":"id","fields":[{"name":"id","type":"u64"}],"indexes":["q"]}"#,
                "not a field",
            ),
            (r#"{"key":"id","fields":[]}"#, "1 to 64 fields"),
        ];
        for (json, why) in cases {
            let schema: SpaceSchema = serde_json::from_str(json).unwrap();
            let err = schema.check().unwrap_err().to_string();
            assert!(err.contains(why), "{json}: {err}");
        }
        assert!(serde_json::from_str::<SpaceSchema>(r#"{"key":"id","fields":[],"extra":1}"#).is_err());
        assert!(serde_json::from_str::<SpaceSchema>(r#"{"key":"id","fields":[{"name":"a","type":"u8"}]}"#).is_err());
    }
}
