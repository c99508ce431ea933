//! The run file's reference, generated from the types that parse it: a JSON Schema
//! (for editors) and a Markdown table of every key with its type, default and meaning
//! (the doc comments). `docs/configuration.md` and `docs/petting.schema.json` are these,
//! committed; a test fails when they are stale or a key has no doc comment.

use serde_json::{Map, Value};

use super::RunConfig;

/// The JSON Schema of `iteration.yaml`.
pub fn json_schema() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(RunConfig)).expect("a schema is JSON");
    if let Value::Object(root) = &mut schema {
        root.insert("title".into(), "petting run file (iteration.yaml)".into());
    }
    schema
}

/// One key of the file.
#[derive(Debug, Clone, PartialEq)]
struct Key {
    /// Dotted path; a map's keys are `<name>`, a list's items `[]`.
    path: String,
    /// Which `env.name` the key belongs to, for the environments' own keys.
    variant: Option<String>,
    kind: String,
    default: Option<String>,
    meaning: String,
    required: bool,
}

/// Each plain key's documented default (`rollout.max_staleness` → `0`), a string without
/// its quotes: what a run file that leaves the key out gets. Keys inside maps and lists
/// have none.
pub fn defaults() -> Vec<(String, String)> {
    keys()
        .into_iter()
        .filter(|k| !k.path.contains(['<', '[']))
        .filter_map(|k| {
            let default = k.default?;
            let text = serde_json::from_str::<String>(&default).unwrap_or(default);
            Some((k.path, text))
        })
        .collect()
}

/// Every key of the file, depth first in the schema's order.
fn keys() -> Vec<Key> {
    let schema = json_schema();
    let defs = schema.get("$defs").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut walker = Walker { defs: &defs, keys: Vec::new() };
    walker.object(&schema, "", None);
    walker.keys
}

struct Walker<'a> {
    defs: &'a Map<String, Value>,
    keys: Vec<Key>,
}

impl<'a> Walker<'a> {
    /// The schema `$ref` names, or the schema itself.
    fn resolve<'s>(&self, schema: &'s Value) -> &'s Value
    where
        'a: 's,
    {
        let defs: &'a Map<String, Value> = self.defs;
        match schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
            Some(name) => self.resolve(&defs[name]),
            None => schema,
        }
    }

    /// The schema of an optional value's value (`anyOf: [T, null]`), or the schema.
    fn unwrap_optional<'s>(&self, schema: &'s Value) -> &'s Value
    where
        'a: 's,
    {
        let schema = self.resolve(schema);
        match schema.get("anyOf").and_then(Value::as_array) {
            Some(options) if options.len() == 2 && options.iter().any(is_null) => {
                self.resolve(options.iter().find(|o| !is_null(o)).expect("one is not null"))
            }
            _ => schema,
        }
    }

    fn object<'s>(&mut self, schema: &'s Value, prefix: &str, variant: Option<&str>)
    where
        'a: 's,
    {
        let schema = self.unwrap_optional(schema);
        if let Some(variants) = schema.get("oneOf").and_then(Value::as_array).filter(|v| tagged(v)) {
            for v in variants {
                let name = v["properties"]["name"]["const"].as_str().unwrap_or_default().to_string();
                let first = self.keys.len();
                self.object(v, prefix, Some(&name));
                // The tag's meaning is the variant's.
                let tag = self.keys[first..].iter_mut().find(|k| k.path.ends_with("name") && k.meaning.is_empty());
                if let (Some(tag), Some(meaning)) = (tag, v.get("description").and_then(Value::as_str)) {
                    tag.meaning = one_line(meaning);
                }
            }
            return;
        }
        let required: Vec<&str> =
            schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return };
        // An environment's `name` first: it says which environment the keys are of.
        let mut properties: Vec<_> = properties.iter().collect();
        properties.sort_by_key(|(name, _)| variant.is_none() || *name != "name");
        for (name, property) in properties {
            let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
            self.key(property, path, variant, required.contains(&name.as_str()));
        }
    }

    fn key<'s>(&mut self, property: &'s Value, path: String, variant: Option<&str>, required: bool)
    where
        'a: 's,
    {
        let value = self.unwrap_optional(property);
        let meaning = [property, self.resolve(property), value]
            .iter()
            .find_map(|s| s.get("description").and_then(Value::as_str))
            .unwrap_or_default();
        self.keys.push(Key {
            path: path.clone(),
            variant: variant.map(str::to_owned),
            kind: self.kind(property),
            // A section's default is its keys' defaults, shown on their rows.
            default: property
                .get("default")
                .filter(|d| !d.is_null() && !d.is_object())
                .map(|d| serde_json::to_string(d).expect("JSON")),
            meaning: one_line(meaning.split("\n\n").next().unwrap_or_default()),
            required,
        });
        let tagged_variants = value.get("oneOf").and_then(Value::as_array).is_some_and(|v| tagged(v));
        if value.get("properties").is_some() || tagged_variants {
            self.object(value, &path, variant);
        } else if let Some(item) = value.get("additionalProperties").filter(|a| a.is_object()) {
            self.nested(item, format!("{path}.<name>"), variant);
        } else if let Some(item) = value.get("items").filter(|a| a.is_object()) {
            self.nested(item, format!("{path}[]"), variant);
        }
    }

    /// A map's values or a list's items: their keys, if they are objects.
    fn nested<'s>(&mut self, item: &'s Value, path: String, variant: Option<&str>)
    where
        'a: 's,
    {
        if self.unwrap_optional(item).get("properties").is_some() {
            self.object(item, &path, variant);
        }
    }

    /// The value's type as a reader writes it: `integer`, `"a" | "b"`, `list of string`.
    fn kind(&self, schema: &Value) -> String {
        let resolved = self.resolve(schema);
        let nullable = |key: &str| {
            resolved.get(key).and_then(Value::as_array).is_some_and(|v| v.iter().any(|o| is_null(o) || o == "null"))
        };
        let kind = self.plain_kind(self.unwrap_optional(schema));
        if nullable("anyOf") || nullable("type") { format!("{kind} (optional)") } else { kind }
    }

    fn plain_kind(&self, value: &Value) -> String {
        if let Some(c) = value.get("const") {
            return c.to_string();
        }
        if let Some(values) = value.get("enum").and_then(Value::as_array) {
            return values.iter().map(Value::to_string).collect::<Vec<_>>().join(" \\| ");
        }
        if let Some(options) = value.get("oneOf").or(value.get("anyOf")).and_then(Value::as_array) {
            if tagged(options) {
                return "object (by `name`)".into();
            }
            return options.iter().map(|o| self.plain_kind(self.resolve(o))).collect::<Vec<_>>().join(" \\| ");
        }
        let types: Vec<&str> = match value.get("type") {
            Some(Value::String(t)) => vec![t],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect(),
            _ => vec![],
        };
        let of = |key: &str| value.get(key).filter(|v| v.is_object()).map(|v| self.plain_kind(self.resolve(v)));
        types
            .iter()
            .map(|t| match *t {
                "integer" if value.get("minimum").and_then(Value::as_f64) == Some(0.0) => "integer ≥ 0".to_string(),
                "array" => format!("list of {}", of("items").unwrap_or("values".into())),
                "object" => match of("additionalProperties") {
                    Some(v) => format!("map of name → {v}"),
                    None if value.get("properties").is_some() => "section".into(),
                    None => "object".into(),
                },
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" \\| ")
    }
}

fn is_null(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("null")
}

/// An internally tagged enum (`env: {name: …, …}`): variants that are objects with a
/// constant `name`.
fn tagged(variants: &[Value]) -> bool {
    !variants.is_empty() && variants.iter().all(|v| v["properties"]["name"].get("const").is_some())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// `docs/configuration.md`.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every key of a run file (`iteration.yaml`), generated from the types that parse it by \
         `petting config schema --format markdown`; `petting config schema` prints the JSON Schema \
         (`docs/petting.schema.json`) that editors use to complete and check run files. \
         `petting config show FILE` prints a file with every default filled in. A map's keys are \
         written `<name>`, a list's items `[]`; the environments' own keys are listed per `env.name`.\n",
    );
    let keys = keys();
    // The top level's single values first, then a section per top-level key (per
    // environment for `env`).
    let has_keys = |path: &str| keys.iter().any(|k| k.path.starts_with(&format!("{path}.")));
    let heading = |key: &Key| {
        let top = key.path.split(['.', '[']).next().unwrap_or_default();
        match &key.variant {
            Some(variant) => format!("`{top}` (name: {variant})"),
            None if top == key.path && !has_keys(top) => "The run".to_string(),
            None => format!("`{top}`"),
        }
    };
    let mut sections: Vec<(String, Vec<&Key>)> = vec![("The run".into(), Vec::new())];
    for key in &keys {
        let heading = heading(key);
        match sections.iter_mut().find(|(h, _)| *h == heading) {
            Some((_, rows)) => rows.push(key),
            None => sections.push((heading, vec![key])),
        }
    }
    for (heading, rows) in sections {
        out.push_str(&format!("\n## {heading}\n\n| key | type | default | meaning |\n|---|---|---|---|\n"));
        for key in rows {
            let default = match (&key.default, key.required) {
                (Some(d), _) => format!("`{}`", d.replace('|', "\\|")),
                (None, true) => "required".into(),
                (None, false) => String::new(),
            };
            out.push_str(&format!("| `{}` | {} | {} | {} |\n", key.path, key.kind, default, key.meaning));
        }
    }
    out
}
