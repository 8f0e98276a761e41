//! Resources and scopes, deduplicated per block, and the regrouping of
//! root rows under them on the way back to OTLP.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, BinaryArray, BinaryBuilder, StringArray, StringBuilder, UInt32Array, UInt32Builder};
use arrow::record_batch::RecordBatch;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::ConvertError;
use super::columns::col;
use crate::attrs::{AttrBuilder, AttrReader};
use crate::schema;

/// FNV-1a, 64 bit: a stable hash (same value in every process and
/// version), used for series ids.
pub(crate) fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

#[derive(Default)]
pub(crate) struct ContextBuilder {
    resource_ids: HashMap<Vec<u8>, u32>,
    resource_hashes: Vec<u64>,
    r_schema_url: StringBuilder,
    r_dropped: UInt32Builder,
    r_entity_refs: BinaryBuilder,
    r_attrs: AttrBuilder,
    scope_ids: HashMap<Vec<u8>, u32>,
    s_name: StringBuilder,
    s_version: StringBuilder,
    s_dropped: UInt32Builder,
    s_schema_url: StringBuilder,
    s_attrs: AttrBuilder,
    key: Vec<u8>,
}

impl std::fmt::Debug for ContextBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextBuilder")
            .field("resources", &self.resource_hashes.len())
            .finish_non_exhaustive()
    }
}

impl ContextBuilder {
    /// The block-local id of a resource (with its schema url).
    pub fn resource(&mut self, r: Option<&Resource>, schema_url: &str) -> u32 {
        self.key.clear();
        match r {
            Some(r) => {
                self.key.push(1);
                // Encoding into a Vec cannot fail.
                // Length-prefixed, so the schema url that follows cannot
                // make two different (resource, url) pairs the same key.
                let _ = r.encode_length_delimited(&mut self.key);
            }
            None => self.key.push(0),
        }
        self.key.extend_from_slice(schema_url.as_bytes());
        if let Some(id) = self.resource_ids.get(&self.key) {
            return *id;
        }
        let id = self.resource_hashes.len() as u32;
        self.resource_ids.insert(self.key.clone(), id);
        self.resource_hashes.push(fnv1a(FNV_OFFSET, &self.key));
        self.r_schema_url.append_value(schema_url);
        match r {
            Some(r) => {
                self.r_dropped.append_value(r.dropped_attributes_count);
                if r.entity_refs.is_empty() {
                    self.r_entity_refs.append_null();
                } else {
                    let refs = Resource {
                        entity_refs: r.entity_refs.clone(),
                        ..Default::default()
                    };
                    self.r_entity_refs.append_value(refs.encode_to_vec());
                }
                self.r_attrs.append_all(id, &r.attributes);
            }
            None => {
                self.r_dropped.append_null();
                self.r_entity_refs.append_null();
            }
        }
        id
    }

    /// A stable hash of a resource's content (not its block-local id).
    pub fn resource_hash(&self, id: u32) -> u64 {
        self.resource_hashes.get(id as usize).copied().unwrap_or(0)
    }

    pub fn scope(&mut self, s: Option<&InstrumentationScope>, schema_url: &str) -> u32 {
        self.key.clear();
        match s {
            Some(s) => {
                self.key.push(1);
                let _ = s.encode_length_delimited(&mut self.key);
            }
            None => self.key.push(0),
        }
        self.key.extend_from_slice(schema_url.as_bytes());
        if let Some(id) = self.scope_ids.get(&self.key) {
            return *id;
        }
        let id = self.scope_ids.len() as u32;
        self.scope_ids.insert(self.key.clone(), id);
        self.s_schema_url.append_value(schema_url);
        match s {
            Some(s) => {
                self.s_name.append_value(&s.name);
                self.s_version.append_value(&s.version);
                self.s_dropped.append_value(s.dropped_attributes_count);
                self.s_attrs.append_all(id, &s.attributes);
            }
            None => {
                self.s_name.append_null();
                self.s_version.append_value("");
                self.s_dropped.append_value(0);
            }
        }
        id
    }

    pub fn approx_bytes(&self) -> usize {
        self.r_attrs.approx_bytes()
            + self.s_attrs.approx_bytes()
            + self.r_schema_url.values_slice().len()
            + self.r_entity_refs.values_slice().len()
            + self.s_name.values_slice().len()
            + self.s_version.values_slice().len()
            + self.s_schema_url.values_slice().len()
            // The dedup keys: one encoded resource or scope each.
            + self.resource_ids.keys().chain(self.scope_ids.keys()).map(Vec::len).sum::<usize>()
    }

    pub fn finish(&mut self, out: &mut Vec<(&'static str, RecordBatch)>) -> Result<(), ConvertError> {
        self.resource_ids.clear();
        self.resource_hashes.clear();
        self.scope_ids.clear();
        let resources = RecordBatch::try_new(
            schema::resources(),
            vec![
                Arc::new(self.r_schema_url.finish()),
                Arc::new(self.r_dropped.finish()),
                Arc::new(self.r_entity_refs.finish()),
            ],
        )?;
        let scopes = RecordBatch::try_new(
            schema::scopes(),
            vec![
                Arc::new(self.s_name.finish()),
                Arc::new(self.s_version.finish()),
                Arc::new(self.s_dropped.finish()),
                Arc::new(self.s_schema_url.finish()),
            ],
        )?;
        out.push((schema::RESOURCES, resources));
        out.push((schema::RESOURCE_ATTRS, self.r_attrs.finish()?));
        out.push((schema::SCOPES, scopes));
        out.push((schema::SCOPE_ATTRS, self.s_attrs.finish()?));
        Ok(())
    }
}

/// Resources and scopes of a block, back as OTLP.
#[derive(Debug)]
pub(crate) struct Contexts {
    pub resources: Vec<(Option<Resource>, String)>,
    pub scopes: Vec<(Option<InstrumentationScope>, String)>,
}

impl Contexts {
    pub fn read(tables: &super::TableSet) -> Result<Self, ConvertError> {
        let rb = tables.get(schema::RESOURCES)?;
        let t = schema::RESOURCES;
        let url: &StringArray = col(rb, t, "schema_url")?;
        let dropped: &UInt32Array = col(rb, t, "dropped_attributes_count")?;
        let refs: &BinaryArray = col(rb, t, "entity_refs")?;
        let mut rattrs = AttrReader::new(tables.get(schema::RESOURCE_ATTRS)?, schema::RESOURCE_ATTRS)?
            .grouped(rb.num_rows())?
            .into_iter();
        let mut resources = Vec::with_capacity(rb.num_rows());
        for row in 0..rb.num_rows() {
            let attributes = rattrs.next().unwrap_or_default();
            let resource = if dropped.is_null(row) {
                None
            } else {
                let entity_refs = if refs.is_null(row) {
                    Vec::new()
                } else {
                    Resource::decode(refs.value(row))
                        .map_err(|_| ConvertError::WrongType {
                            table: t,
                            column: "entity_refs",
                        })?
                        .entity_refs
                };
                Some(Resource {
                    attributes,
                    dropped_attributes_count: dropped.value(row),
                    entity_refs,
                })
            };
            resources.push((resource, url.value(row).to_owned()));
        }

        let sb = tables.get(schema::SCOPES)?;
        let t = schema::SCOPES;
        let name: &StringArray = col(sb, t, "name")?;
        let version: &StringArray = col(sb, t, "version")?;
        let dropped: &UInt32Array = col(sb, t, "dropped_attributes_count")?;
        let url: &StringArray = col(sb, t, "schema_url")?;
        let mut sattrs = AttrReader::new(tables.get(schema::SCOPE_ATTRS)?, schema::SCOPE_ATTRS)?
            .grouped(sb.num_rows())?
            .into_iter();
        let mut scopes = Vec::with_capacity(sb.num_rows());
        for row in 0..sb.num_rows() {
            let attributes = sattrs.next().unwrap_or_default();
            let scope = (!name.is_null(row)).then(|| InstrumentationScope {
                name: name.value(row).to_owned(),
                version: version.value(row).to_owned(),
                attributes,
                dropped_attributes_count: dropped.value(row),
            });
            scopes.push((scope, url.value(row).to_owned()));
        }
        Ok(Contexts { resources, scopes })
    }

    pub fn resource(
        &self,
        id: u32,
        row: usize,
        table: &'static str,
    ) -> Result<&(Option<Resource>, String), ConvertError> {
        self.resources
            .get(id as usize)
            .ok_or(ConvertError::BadReference { table, row })
    }

    pub fn scope(
        &self,
        id: u32,
        row: usize,
        table: &'static str,
    ) -> Result<&(Option<InstrumentationScope>, String), ConvertError> {
        self.scopes
            .get(id as usize)
            .ok_or(ConvertError::BadReference { table, row })
    }
}

/// Items of one scope: (scope id, items).
pub(crate) type ScopeGroup<T> = (u32, Vec<T>);

/// Collects items under (resource id, scope id) in first-seen order, or,
/// for [`Grouper::in_row_order`], into runs of consecutive items that share
/// them, so flattening the groups gives the items back in push order.
#[derive(Debug)]
pub(crate) struct Grouper<T> {
    pub groups: Vec<(u32, Vec<ScopeGroup<T>>)>,
    resource_index: HashMap<u32, usize>,
    scope_index: HashMap<(u32, u32), usize>,
    row_order: bool,
}

impl<T> Default for Grouper<T> {
    fn default() -> Self {
        Grouper {
            groups: Vec::new(),
            resource_index: HashMap::new(),
            scope_index: HashMap::new(),
            row_order: false,
        }
    }
}

impl<T> Grouper<T> {
    /// A grouper that keeps push order: a resource or scope seen again
    /// after another one starts a new group.
    pub fn in_row_order() -> Self {
        Grouper {
            row_order: true,
            ..Grouper::default()
        }
    }

    pub fn push(&mut self, resource_id: u32, scope_id: u32, item: T) {
        if self.row_order {
            match self.groups.last_mut() {
                Some((rid, scopes)) if *rid == resource_id => match scopes.last_mut() {
                    Some((sid, items)) if *sid == scope_id => items.push(item),
                    _ => scopes.push((scope_id, vec![item])),
                },
                _ => self.groups.push((resource_id, vec![(scope_id, vec![item])])),
            }
            return;
        }
        let ri = *self.resource_index.entry(resource_id).or_insert_with(|| {
            self.groups.push((resource_id, Vec::new()));
            self.groups.len() - 1
        });
        let scopes = &mut self.groups[ri].1;
        let si = *self.scope_index.entry((resource_id, scope_id)).or_insert_with(|| {
            scopes.push((scope_id, Vec::new()));
            scopes.len() - 1
        });
        scopes[si].1.push(item);
    }

    /// True for [`Grouper::in_row_order`].
    pub fn keeps_row_order(&self) -> bool {
        self.row_order
    }
}
