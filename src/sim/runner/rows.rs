//! A cell's state table from its scenario's typed rows: the keys every table shares (arm,
//! population, replicate, step, agent, role, policy, model, group path, attributes), then the
//! scenario's own columns, traced from its `Row` type. And each group level's aggregates: the
//! mean of every numeric column over a group's members.

use super::SimError;
use crate::sim::groups::Groups;
use crate::sim::population::{Column, Population};
use crate::sim::scenario::{CellInfo, Scenario, TableError};
use arrow_array::builder::StringDictionaryBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt16Type};
use arrow_array::{
    Array, ArrayRef, DictionaryArray, Float32Array, Float64Array, RecordBatch, StringArray,
    UInt16Array, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, FieldRef, Schema};
use std::sync::Arc;

/// What the keys of a cell's rows are drawn from beyond the cell itself.
pub struct Keys<'a> {
    /// The role of each agent, when the scenario has several.
    pub roles: Option<Vec<&'static str>>,
    /// Each agent's policy name, under policy groups.
    pub policy: Option<Vec<&'static str>>,
    /// Each agent's model (empty for an agent no model decides for), in runs of several
    /// models.
    pub model: Option<Vec<&'a str>>,
    pub population: &'a Population,
}

fn dictionary<'a>(values: impl ExactSizeIterator<Item = &'a str>) -> ArrayRef {
    // Sized to the column: `new()` reserves for 1,024 keys and values, which the finished
    // arrays keep, so that a run of many small cells held kilobytes per cell and column.
    let mut builder = StringDictionaryBuilder::<UInt16Type>::with_capacity(values.len(), 4, 64);
    for v in values {
        builder.append_value(v);
    }
    Arc::new(builder.finish())
}

fn dictionary_field(name: &str) -> Field {
    Field::new(
        name,
        DataType::Dictionary(Box::new(DataType::UInt16), Box::new(DataType::Utf8)),
        false,
    )
}

/// The state table of one cell after `step`: keys for the agents that have a row, then
/// their rows. An error says what the scenario's rows got wrong; the caller names the
/// scenario.
pub fn state<S: Scenario>(
    scenario: &S,
    fields: &[FieldRef],
    world: &S::World,
    keys: &Keys<'_>,
    cell: &CellInfo,
    step: usize,
) -> Result<RecordBatch, TableError> {
    let n = scenario.num_agents(world);
    let (agents, rows): (Vec<usize>, Vec<S::Row>) = (0..n)
        .filter_map(|a| scenario.row(world, a, step).map(|r| (a, r)))
        .unzip();
    let m = agents.len();
    let constant = |v: usize| Arc::new(UInt64Array::from_value(v as u64, m)) as ArrayRef;
    let mut schema = vec![
        dictionary_field("arm"),
        Field::new("population", DataType::UInt64, false),
        Field::new("replicate", DataType::UInt64, false),
        Field::new("step", DataType::UInt64, false),
        Field::new("agent", DataType::UInt64, false),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        dictionary(std::iter::repeat_n(cell.arm.as_str(), m)),
        constant(cell.population),
        constant(cell.replicate),
        constant(step),
        Arc::new(UInt64Array::from_iter_values(
            agents.iter().map(|&a| a as u64),
        )),
    ];
    if let Some(roles) = &keys.roles {
        schema.push(dictionary_field("role"));
        columns.push(dictionary(agents.iter().map(|&a| roles[a])));
    }
    if let Some(policy) = &keys.policy {
        schema.push(dictionary_field("policy"));
        columns.push(dictionary(agents.iter().map(|&a| policy[a])));
    }
    if let Some(model) = &keys.model {
        schema.push(dictionary_field("model"));
        columns.push(dictionary(agents.iter().map(|&a| model[a])));
    }
    for level in &keys.population.groups.levels {
        schema.push(Field::new(&level.name, DataType::UInt32, false));
        columns.push(Arc::new(UInt32Array::from_iter_values(
            agents.iter().map(|&a| level.of_agent[a]),
        )));
    }
    for (name, column) in &keys.population.columns {
        match column {
            Column::Categorical { categories, codes } => {
                schema.push(dictionary_field(name));
                let keys = UInt16Array::from_iter_values(agents.iter().map(|&a| codes[a]));
                let values = Arc::new(StringArray::from_iter_values(categories.iter()));
                columns.push(Arc::new(
                    DictionaryArray::<UInt16Type>::try_new(keys, values)
                        .expect("invariant: codes index the categories"),
                ));
            }
            Column::Numeric { values, .. } => {
                schema.push(Field::new(name, DataType::Float32, false));
                columns.push(Arc::new(Float32Array::from_iter_values(
                    agents.iter().map(|&a| values[a]),
                )));
            }
        }
    }
    let own = scenario.records().row_columns(fields, &rows)?;
    if own.num_rows() != m {
        return Err(TableError(format!(
            "its columns hold {} rows for the {m} agents that have a row",
            own.num_rows()
        )));
    }
    for (field, column) in own.schema().fields().iter().zip(own.columns()) {
        if schema.iter().any(|f| f.name() == field.name()) {
            return Err(TableError(format!(
                "its row has a column `{}`, which the runner writes itself (a key, a group level \
                 or a population attribute): rename the row's field",
                field.name()
            )));
        }
        schema.push(field.as_ref().clone());
        columns.push(column.clone());
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(schema)), columns)
        .expect("invariant: columns of one length and their fields' types"))
}

/// Per group level, per group: its place (level, group, parent group, label, size) and the
/// mean over its members of every numeric column of `state` (one cell after one step), in a
/// long table: `groups.parquet`.
pub(crate) fn group_means(
    groups: &Groups,
    state: &RecordBatch,
    cell: &CellInfo,
    step: usize,
) -> Option<RecordBatch> {
    if groups.is_empty() || state.num_rows() == 0 {
        return None;
    }
    let agent = state
        .column_by_name("agent")?
        .as_primitive_opt::<arrow_array::types::UInt64Type>()?;
    let numeric = numeric_columns(groups, state);
    let mut level_names = Vec::new();
    let mut group_ids = Vec::new();
    let mut parents: Vec<Option<u32>> = Vec::new();
    let mut labels = Vec::new();
    let mut sizes = Vec::new();
    let mut means: Vec<Vec<Option<f64>>> = vec![Vec::new(); numeric.len()];
    for level in &groups.levels {
        let k = level.len();
        let mut sum = vec![vec![0.0f64; k]; numeric.len()];
        let mut count = vec![vec![0u64; k]; numeric.len()];
        for (row, a) in agent.values().iter().enumerate() {
            let g = level.of_agent[*a as usize] as usize;
            for (j, (_, values)) in numeric.iter().enumerate() {
                if values.is_valid(row) {
                    sum[j][g] += values.value(row);
                    count[j][g] += 1;
                }
            }
        }
        for g in 0..k {
            level_names.push(level.name.as_str());
            group_ids.push(g as u32);
            parents.push(level.parent.get(g).copied());
            labels.push(level.labels[g].as_str());
            sizes.push(level.sizes[g]);
            for j in 0..numeric.len() {
                means[j].push((count[j][g] > 0).then(|| sum[j][g] / count[j][g] as f64));
            }
        }
    }
    let m = group_ids.len();
    let constant = |v: usize| Arc::new(UInt64Array::from_value(v as u64, m)) as ArrayRef;
    let mut columns: Vec<(String, ArrayRef, bool)> = vec![
        (
            "arm".into(),
            dictionary(std::iter::repeat_n(cell.arm.as_str(), m)),
            false,
        ),
        ("population".into(), constant(cell.population), false),
        ("replicate".into(), constant(cell.replicate), false),
        ("step".into(), constant(step), false),
        ("level".into(), dictionary(level_names.into_iter()), false),
        (
            "group".into(),
            Arc::new(UInt32Array::from(group_ids)),
            false,
        ),
        ("parent".into(), Arc::new(UInt32Array::from(parents)), true),
        ("label".into(), Arc::new(StringArray::from(labels)), false),
        ("size".into(), Arc::new(UInt32Array::from(sizes)), false),
    ];
    for ((name, _), values) in numeric.iter().zip(means) {
        columns.push((
            format!("mean_{name}"),
            Arc::new(Float64Array::from(values)),
            true,
        ));
    }
    let schema = Schema::new(
        columns
            .iter()
            .map(|(n, c, nullable)| Field::new(n, c.data_type().clone(), *nullable))
            .collect::<Vec<_>>(),
    );
    Some(
        RecordBatch::try_new(
            Arc::new(schema),
            columns.into_iter().map(|(_, c, _)| c).collect(),
        )
        .expect("invariant: columns of one length"),
    )
}

/// The columns of `state` whose group means `groups.parquet` holds, as floats: the numeric
/// and boolean ones that are neither a key nor a group level.
fn numeric_columns(groups: &Groups, state: &RecordBatch) -> Vec<(String, Float64Array)> {
    state
        .schema()
        .fields()
        .iter()
        .zip(state.columns())
        .filter(|(f, _)| {
            !matches!(
                f.name().as_str(),
                "population" | "replicate" | "step" | "agent"
            ) && groups.levels.iter().all(|l| &l.name != f.name())
                && (f.data_type().is_numeric() || f.data_type() == &DataType::Boolean)
        })
        .filter_map(|(f, c)| {
            let c = arrow_cast::cast(c, &DataType::Float64).ok()?;
            Some((f.name().clone(), c.as_primitive::<Float64Type>().clone()))
        })
        .collect()
}

/// The columns of a per-cell record: the cell's keys (see [`crate::record::CELL_KEYS`]), then
/// the scenario's `own`.
pub(crate) fn keyed_schema(own: &arrow_schema::Schema) -> arrow_schema::SchemaRef {
    let keys = [
        Field::new(crate::record::CELL_KEYS[0], DataType::LargeUtf8, false),
        Field::new(crate::record::CELL_KEYS[1], DataType::UInt64, false),
        Field::new(crate::record::CELL_KEYS[2], DataType::UInt64, false),
        Field::new(crate::record::CELL_KEYS[3], DataType::UInt64, false),
    ];
    let fields: Vec<FieldRef> = keys
        .into_iter()
        .map(Arc::new)
        .chain(own.fields().iter().cloned())
        .collect();
    Arc::new(arrow_schema::Schema::new(fields))
}

/// The scenario's rows `own` of `cell` after `step`, with the cell's keys in front.
pub fn keyed(own: &RecordBatch, cell: &CellInfo, step: usize) -> Result<RecordBatch, SimError> {
    let m = own.num_rows();
    let constant = |v: usize| Arc::new(UInt64Array::from_value(v as u64, m)) as ArrayRef;
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(arrow_array::LargeStringArray::from_iter_values(
            std::iter::repeat_n(cell.arm.as_str(), m),
        )),
        constant(cell.population),
        constant(cell.replicate),
        constant(step),
    ];
    columns.extend(own.columns().iter().cloned());
    RecordBatch::try_new(keyed_schema(&own.schema()), columns).map_err(|e| {
        SimError::Setup(format!(
            "the scenario's aggregates row of arm `{}`, replicate {}, step {step}: {e}",
            cell.arm, cell.replicate
        ))
    })
}
