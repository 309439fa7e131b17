//! Qdrant filters and ids: the mandatory user condition, the memory filters, point ids.

use qdrant_edge::external::ordered_float::OrderedFloat;
use qdrant_edge::{
    Condition, FieldCondition, Filter, JsonPath, Match, PointId, Range, ValueVariants,
};

use crate::index::vector::{IndexError, VectorFilter, fields};
use crate::store::MemoryId;

use super::*;

pub(super) fn key(name: &str) -> Result<JsonPath, IndexError> {
    JsonPath::try_from(name)
        .map_err(|()| IndexError::Internal(format!("invalid payload key {name:?}")))
}

pub(super) fn field_match(name: &str, m: Match) -> Result<Condition, IndexError> {
    Ok(Condition::Field(FieldCondition::new_match(key(name)?, m)))
}

/// Mandatory `user_id` condition plus the optional restrictions of `filter`.
pub(super) fn build_filter(
    user: Tenant,
    filter: Option<&VectorFilter>,
) -> Result<Filter, IndexError> {
    let mut must = vec![field_match(
        fields::USER_ID,
        Match::new_value(ValueVariants::String(user.to_string())),
    )?];
    if let Some(f) = filter {
        // Kinds stay a positive match here: `must_not` on kind made the filtered HNSW search
        // of a 100k-memory user slower at 1M points (`mnemo bench recall`).
        if let Some(kinds) = &f.kinds {
            must.push(field_match(fields::KIND, Match::from(kinds.clone()))?);
        }
        if f.since_ms.is_some() || f.until_ms.is_some() {
            let range = Range {
                gte: f.since_ms.map(|ms| OrderedFloat(ms as f64)),
                lt: f.until_ms.map(|ms| OrderedFloat(ms as f64)),
                gt: None,
                lte: None,
            };
            must.push(Condition::Field(FieldCondition::new_range(
                key(fields::CREATED_AT_MS)?,
                range,
            )));
        }
        if !f.include_archived {
            must.push(field_match(fields::ARCHIVED, Match::from(false))?);
        }
        if !f.include_invalid {
            must.push(field_match(fields::VALID, Match::from(true))?);
        }
    }
    Ok(Filter {
        should: None,
        min_should: None,
        must: Some(must),
        must_not: None,
    })
}

pub(super) fn memory_id(id: PointId) -> Result<MemoryId, IndexError> {
    match id {
        PointId::Uuid(uuid) => Ok(MemoryId::from_uuid(uuid)),
        PointId::NumId(n) => Err(IndexError::Internal(format!(
            "foreign numeric point id {n} in edge shard"
        ))),
    }
}
