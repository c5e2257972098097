//! Nested groups: agents in teams, teams in villages, villages in regions. A config lists the
//! levels from the innermost out (`[[population.groups]]`), each either of a fixed size (`size`
//! members of the level below: agents for the first level) or one group per category of a
//! population attribute (`by = "region"`). Every group sits whole inside one group of each
//! level above it.
//!
//! Building runs from the innermost level out. A level's units (agents, or the groups of the
//! level below) are ordered by the categories of every `by` level at or above it, which keeps
//! each unit inside its enclosing groups; then a `by` level makes one group per category, and a
//! sized level cuts each run of units of the same categories into groups of `size`, in order.
//! When the units do not divide evenly, the level's `remainder` says what happens: `"refuse"`
//! (the default, checked before a run starts, where sizes alone decide it) or `"smaller"` (the
//! last group of each run holds what is left).
#![warn(missing_docs)]

use super::column::Column;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The most levels a config may nest.
pub(crate) const MAX_LEVELS: usize = 8;

/// One level as written in `[[population.groups]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelConfig {
    /// The level's name: its column in the records and its name in prompts (`team`).
    pub level: String,
    /// Members per group: agents for the first level, groups of the level below otherwise.
    pub size: Option<usize>,
    /// A categorical population attribute: one group per category.
    pub by: Option<String>,
    /// What to do when `size` does not divide the members.
    #[serde(default)]
    pub remainder: Remainder,
}

/// What a sized level does with members that do not fill a last group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remainder {
    /// Refuse the population size, naming the sizes that divide.
    #[default]
    Refuse,
    /// The last group of each run is smaller.
    Smaller,
}

/// How a validated level forms its groups.
#[derive(Debug, Clone, PartialEq)]
pub enum Form {
    /// Groups of `size` members each (agents at the first level, groups of the level below
    /// above it).
    Size {
        /// Members per group.
        size: usize,
        /// What the last group of each run is when `size` does not divide.
        remainder: Remainder,
    },
    /// The categorical attribute whose categories are the groups.
    By {
        /// The attribute's name.
        attribute: String,
    },
}

/// A validated level.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelSpec {
    /// The level's name (`team`): a column of the records.
    pub name: String,
    /// How its groups form.
    pub form: Form,
}

/// A problem with `[[population.groups]]`: which entry, and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupsProblem {
    /// Where in the config file, when known.
    pub span: Option<Range<usize>>,
    /// The field at fault, under `population.groups`.
    pub field: String,
    /// What is wrong, and the fix.
    pub message: String,
}

/// Names a level may not take: the record columns the runner writes itself.
const RESERVED: &[&str] = &[
    "arm",
    "population",
    "replicate",
    "step",
    "agent",
    "role",
    "policy",
    "persona",
];

/// Checks the levels against each other and the population's attributes (`categorical`: the
/// names of its categorical attributes; `attributes`: all of them).
pub fn validate(
    levels: &[toml::Spanned<LevelConfig>],
    categorical: &[&str],
    attributes: &[&str],
) -> Result<Vec<LevelSpec>, GroupsProblem> {
    if levels.len() > MAX_LEVELS {
        return Err(GroupsProblem {
            span: levels.get(MAX_LEVELS).map(|l| l.span()),
            field: "population.groups".into(),
            message: format!(
                "{} levels: at most {MAX_LEVELS} can nest; join some",
                levels.len()
            ),
        });
    }
    let mut specs: Vec<LevelSpec> = Vec::new();
    for (i, spanned) in levels.iter().enumerate() {
        let level = spanned.get_ref();
        let problem = |message: String| GroupsProblem {
            span: Some(spanned.span()),
            field: format!("population.groups[{i}]"),
            message,
        };
        let name = level.level.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(problem(format!(
                "level `{}`: a level's name is a record column: use letters, digits, `_` or `-`",
                level.level
            )));
        }
        if RESERVED.contains(&name) || attributes.contains(&name) {
            return Err(problem(format!(
                "level `{name}`: that name is already a column of the records (the runner's keys \
                 or a population attribute): call the level something else, e.g. `{name}_group`"
            )));
        }
        if specs.iter().any(|s| s.name == name) {
            return Err(problem(format!("level `{name}` is listed twice")));
        }
        let form = form(level, name, categorical, problem)?;
        if level.remainder == Remainder::Smaller && matches!(form, Form::By { .. }) {
            return Err(problem(format!(
                "level `{name}`: `remainder` applies to a sized level, not to `by`"
            )));
        }
        specs.push(LevelSpec {
            name: name.to_string(),
            form,
        });
    }
    // Where any level is formed `by` an attribute, the categories' counts decide whether a
    // size divides, and they are known only once agents are drawn.
    let any_by = specs.iter().any(|s| matches!(s.form, Form::By { .. }));
    for (i, spec) in specs.iter().enumerate() {
        if let Form::Size {
            remainder: Remainder::Refuse,
            ..
        } = spec.form
            && any_by
        {
            return Err(GroupsProblem {
                span: Some(levels[i].span()),
                field: format!("population.groups[{i}]"),
                message: format!(
                    "level `{}` is cut by size among groups formed `by` an attribute, whose \
                     categories' counts no size divides in general: add `remainder = \"smaller\"` \
                     (the last group of each category holds what is left)",
                    spec.name
                ),
            });
        }
    }
    Ok(specs)
}

/// How level `name` forms its groups: by size, or one per category of a categorical
/// attribute; what is wrong with it, if it says neither or both.
fn form(
    level: &LevelConfig,
    name: &str,
    categorical: &[&str],
    problem: impl Fn(String) -> GroupsProblem,
) -> Result<Form, GroupsProblem> {
    let form = match (level.size, &level.by) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(problem(format!(
                "level `{name}` needs exactly one of `size` (members per group) and `by` (a \
                 categorical attribute: one group per category)"
            )));
        }
        (Some(0), None) => {
            return Err(problem(format!("level `{name}`: size must be at least 1")));
        }
        (Some(size), None) => Form::Size {
            size,
            remainder: level.remainder,
        },
        (None, Some(attribute)) => {
            if !categorical.contains(&attribute.as_str()) {
                return Err(problem(format!(
                    "level `{name}`: `by = \"{attribute}\"` must name a categorical attribute \
                     of [population.attributes] (categorical ones here: {})",
                    if categorical.is_empty() {
                        "none".to_string()
                    } else {
                        categorical.join(", ")
                    }
                )));
            }
            Form::By {
                attribute: attribute.clone(),
            }
        }
    };
    Ok(form)
}

/// A population that a level with `remainder = "refuse"` does not divide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{size} agents do not divide into groups of level `{level}` ({units} {what} of {k}): give a \
     population that is a multiple of {product} (e.g. {below}{above}), or set \
     `remainder = \"smaller\"` on that level",
    what = if *.outermost { "agents into groups" } else { "groups into groups" },
    below = if *.below > 0 { format!("{} or ", .below) } else { String::new() },
)]
pub struct Indivisible {
    size: usize,
    level: String,
    /// Members of the level's groups: agents, or groups of the level inside it.
    units: usize,
    k: usize,
    /// The size every population must be a multiple of, and the nearest such sizes.
    product: usize,
    below: usize,
    above: usize,
    outermost: bool,
}

/// Checks that `levels` divide a population of `size` agents where they must (sized levels
/// with `remainder = "refuse"`, none inside a `by` level): the refusal names the nearest
/// sizes that do.
pub(crate) fn check_divides(levels: &[LevelSpec], size: usize) -> Result<(), Indivisible> {
    let mut units = size;
    let mut product = 1usize;
    for spec in levels {
        let Form::Size { size: k, remainder } = spec.form else {
            return Ok(());
        };
        product = product.saturating_mul(k);
        if remainder == Remainder::Refuse && !units.is_multiple_of(k) {
            let below = size / product * product;
            let above = below.saturating_add(product);
            return Err(Indivisible {
                size,
                level: spec.name.clone(),
                units,
                k,
                product,
                below,
                above,
                outermost: spec.name == levels[0].name,
            });
        }
        units = units.div_ceil(k);
    }
    Ok(())
}

/// One level of a drawn population's groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Level {
    /// The level's name.
    pub name: String,
    /// Each agent's group at this level.
    pub of_agent: Vec<u32>,
    /// Each group's group at the level above (empty at the outermost level).
    pub parent: Vec<u32>,
    /// Each group's label: its category for a `by` level, else its number.
    pub labels: Vec<String>,
    /// Each group's number of agents.
    pub sizes: Vec<u32>,
}

impl Level {
    /// Its number of groups.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether it has no group (a population of no agents).
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}

/// The groups of one cell's agents, every level, innermost first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Groups {
    /// Every level, innermost first.
    pub levels: Vec<Level>,
    /// Per level, the agents of each group in agent order, flattened: group `g`'s members are
    /// `members[level][starts[level][g]..starts[level][g + 1]]`.
    members: Vec<Vec<u32>>,
    starts: Vec<Vec<u32>>,
    /// The same for each group's groups one level down (empty lists at the first level).
    children: Vec<Vec<u32>>,
    child_starts: Vec<Vec<u32>>,
}

/// One group, as a level's reaction sees it.
#[derive(Debug, Clone, Copy)]
pub struct GroupRef<'a> {
    /// Its level, an index into [`Groups::levels`] (0: innermost).
    pub level: usize,
    /// Its number within the level.
    pub index: usize,
    /// Its agents, in agent order.
    pub members: &'a [u32],
    /// Its groups one level down (empty at the first level).
    pub children: &'a [u32],
}

impl Groups {
    /// Builds the levels over the `n` agents whose attributes are `columns` (see the
    /// module's documentation).
    pub fn build(levels: &[LevelSpec], n: usize, columns: &[(String, Column)]) -> Self {
        let column = |name: &str| columns.iter().find(|(c, _)| c == name).map(|(_, c)| c);
        let by_code = |attribute: &str| -> Vec<u16> {
            match column(attribute) {
                Some(Column::Categorical { codes, .. }) => codes.clone(),
                _ => vec![0; n],
            }
        };
        let by_label = |attribute: &str, code: u16| -> String {
            match column(attribute) {
                Some(Column::Categorical { categories, .. }) => categories[code as usize].clone(),
                _ => String::new(),
            }
        };
        // Each level's stratum key per agent: codes of every `by` level at or above it.
        let codes: Vec<Option<Vec<u16>>> = levels
            .iter()
            .map(|l| match &l.form {
                Form::By { attribute } => Some(by_code(attribute)),
                Form::Size { .. } => None,
            })
            .collect();
        let key = |level: usize, agent: usize| -> Vec<u16> {
            codes[level..]
                .iter()
                .rev()
                .flatten()
                .map(|c| c[agent])
                .collect()
        };
        let mut built: Vec<Level> = Vec::new();
        // The units of the level being built: (a representative agent, agents).
        let mut units: Vec<Vec<u32>> = (0..n as u32).map(|a| vec![a]).collect();
        let mut children: Vec<Vec<u32>> = Vec::new();
        let mut child_starts: Vec<Vec<u32>> = Vec::new();
        for (l, spec) in levels.iter().enumerate() {
            let mut order: Vec<usize> = (0..units.len()).collect();
            order.sort_by_key(|&u| key(l, units[u][0] as usize));
            let mut groups: Vec<Vec<usize>> = Vec::new();
            let mut labels = Vec::new();
            let mut run_start = 0;
            while run_start < order.len() {
                let run_key = key(l, units[order[run_start]][0] as usize);
                let mut run_end = run_start;
                while run_end < order.len() && key(l, units[order[run_end]][0] as usize) == run_key
                {
                    run_end += 1;
                }
                let run = &order[run_start..run_end];
                match &spec.form {
                    Form::By { attribute } => {
                        let code = codes[l].as_ref().expect("a by level has codes")
                            [units[run[0]][0] as usize];
                        labels.push(by_label(attribute, code));
                        groups.push(run.to_vec());
                    }
                    Form::Size { size, .. } => {
                        for chunk in run.chunks(*size) {
                            labels.push(groups.len().to_string());
                            groups.push(chunk.to_vec());
                        }
                    }
                }
                run_start = run_end;
            }
            let mut of_agent = vec![0u32; n];
            let mut sizes = Vec::with_capacity(groups.len());
            let mut next_units = Vec::with_capacity(groups.len());
            for (g, members) in groups.iter().enumerate() {
                let mut agents: Vec<u32> = members
                    .iter()
                    .flat_map(|&u| units[u].iter().copied())
                    .collect();
                agents.sort_unstable();
                for &a in &agents {
                    of_agent[a as usize] = g as u32;
                }
                sizes.push(agents.len() as u32);
                next_units.push(agents);
            }
            if let Some(below) = built.last_mut() {
                below.parent = vec![0; below.len()];
                for (g, members) in groups.iter().enumerate() {
                    for &u in members {
                        below.parent[u] = g as u32;
                    }
                }
            }
            if l == 0 {
                children.push(Vec::new());
                child_starts.push(vec![0; groups.len() + 1]);
            } else {
                children.push(groups.iter().flatten().map(|&u| u as u32).collect());
                let mut start = vec![0u32];
                for members in &groups {
                    start.push(start.last().unwrap() + members.len() as u32);
                }
                child_starts.push(start);
            }
            built.push(Level {
                name: spec.name.clone(),
                of_agent,
                parent: Vec::new(),
                labels,
                sizes,
            });
            units = next_units;
        }
        // Each group's agents, for the reactions, in agent order.
        let mut members = Vec::with_capacity(built.len());
        let mut starts = Vec::with_capacity(built.len());
        for level in &built {
            let mut start = vec![0u32; level.len() + 1];
            for (g, s) in level.sizes.iter().enumerate() {
                start[g + 1] = start[g] + s;
            }
            let mut fill = start.clone();
            let mut flat = vec![0u32; n];
            for (a, &g) in level.of_agent.iter().enumerate() {
                flat[fill[g as usize] as usize] = a as u32;
                fill[g as usize] += 1;
            }
            members.push(flat);
            starts.push(start);
        }
        Self {
            levels: built,
            members,
            starts,
            children,
            child_starts,
        }
    }

    /// Whether the population has no groups at all.
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    /// The agents of group `group` of level `level`, in agent order.
    pub fn members(&self, level: usize, group: usize) -> &[u32] {
        let s = &self.starts[level];
        &self.members[level][s[group] as usize..s[group + 1] as usize]
    }

    /// The groups one level down that make up group `group` of level `level` (none at the
    /// first level, whose members are agents).
    pub fn children(&self, level: usize, group: usize) -> &[u32] {
        let s = &self.child_starts[level];
        &self.children[level][s[group] as usize..s[group + 1] as usize]
    }

    /// Agent `agent`'s group at every level, innermost first.
    pub fn path(&self, agent: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.levels
            .iter()
            .enumerate()
            .map(move |(l, level)| (l, level.of_agent[agent] as usize))
    }

    /// Every group of every level, innermost level first: the order of bottom-up resolution.
    pub fn bottom_up(&self) -> impl Iterator<Item = GroupRef<'_>> + '_ {
        self.levels.iter().enumerate().flat_map(move |(l, level)| {
            (0..level.len()).map(move |g| GroupRef {
                level: l,
                index: g,
                members: self.members(l, g),
                children: self.children(l, g),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn sized(name: &str, size: usize, remainder: Remainder) -> LevelSpec {
        LevelSpec {
            name: name.into(),
            form: Form::Size { size, remainder },
        }
    }

    /// Ten agents, regions alternating north/south/north...: teams of 2 inside regions put
    /// agents 0,2 / 4,6 / 8 (north) and 1,3 / 5,7 / 9 (south) together, each region's last
    /// team smaller; a region is the parent of its own teams only.
    #[test]
    fn sized_groups_nest_inside_attribute_groups() {
        let columns = [(
            "region".to_string(),
            Column::Categorical {
                categories: Arc::from(vec!["north".to_string(), "south".to_string()]),
                codes: (0..10).map(|i| (i % 2) as u16).collect(),
            },
        )];
        let levels = [
            sized("team", 2, Remainder::Smaller),
            LevelSpec {
                name: "area".into(),
                form: Form::By {
                    attribute: "region".into(),
                },
            },
        ];
        let g = Groups::build(&levels, 10, &columns);
        let teams: Vec<&[u32]> = (0..g.levels[0].len()).map(|t| g.members(0, t)).collect();
        assert_eq!(
            teams,
            vec![&[0, 2][..], &[4, 6], &[8], &[1, 3], &[5, 7], &[9]]
        );
        assert_eq!(g.levels[0].parent, vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(g.levels[1].labels, vec!["north", "south"]);
        assert_eq!(g.levels[1].sizes, vec![5, 5]);
        assert_eq!(g.children(1, 1), &[3, 4, 5]);
        assert_eq!(g.path(7).collect::<Vec<_>>(), vec![(0, 4), (1, 1)]);
        let order: Vec<(usize, usize)> = g.bottom_up().map(|r| (r.level, r.index)).collect();
        assert_eq!(order[..6], [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5)]);
        assert_eq!(order[6..], [(1, 0), (1, 1)]);
    }

    #[test]
    fn sizes_that_do_not_divide_name_the_sizes_that_do() {
        let levels = [
            sized("team", 5, Remainder::Refuse),
            sized("village", 4, Remainder::Refuse),
        ];
        assert!(check_divides(&levels, 200).is_ok());
        let err = check_divides(&levels, 210).unwrap_err().to_string();
        assert!(
            err.contains("level `village`") && err.contains("multiple of 20"),
            "{err}"
        );
        assert!(err.contains("200 or 220"), "{err}");
        let err = check_divides(&levels, 7).unwrap_err().to_string();
        assert!(
            err.contains("level `team`") && err.contains("multiple of 5"),
            "{err}"
        );
        let smaller = [sized("team", 5, Remainder::Smaller)];
        assert!(check_divides(&smaller, 7).is_ok());
        let g = Groups::build(&smaller, 7, &[]);
        assert_eq!(g.levels[0].sizes, vec![5, 2]);
    }

    fn configs(text: &str) -> Vec<toml::Spanned<LevelConfig>> {
        #[derive(Deserialize)]
        struct Doc {
            groups: Vec<toml::Spanned<LevelConfig>>,
        }
        toml::from_str::<Doc>(text).unwrap().groups
    }

    #[test]
    fn bad_levels_are_refused_with_the_fix() {
        let cases = [
            (
                "[[groups]]\nlevel = \"team\"\n",
                "needs exactly one of `size`",
            ),
            (
                "[[groups]]\nlevel = \"team\"\nsize = 0\n",
                "size must be at least 1",
            ),
            (
                "[[groups]]\nlevel = \"agent\"\nsize = 2\n",
                "already a column",
            ),
            (
                "[[groups]]\nlevel = \"age\"\nsize = 2\n",
                "already a column",
            ),
            (
                "[[groups]]\nlevel = \"a\"\nsize = 2\n[[groups]]\nlevel = \"a\"\nsize = 2\n",
                "listed twice",
            ),
            (
                "[[groups]]\nlevel = \"area\"\nby = \"age\"\n",
                "must name a categorical attribute",
            ),
            (
                "[[groups]]\nlevel = \"team\"\nsize = 3\n[[groups]]\nlevel = \"area\"\nby = \"region\"\n",
                "add `remainder = \"smaller\"`",
            ),
        ];
        for (text, want) in cases {
            let err = validate(&configs(text), &["region"], &["region", "age"]).unwrap_err();
            assert!(err.message.contains(want), "{text}: {}", err.message);
        }
    }
}
