//! `petting init`: one of the shipped, commented run files, written where the user wants
//! it with its paths made to work from there.

use std::path::{Path, PathBuf};

use super::args::{InitArgs, Template};
use super::exit::Refused;

/// A file a template writes: its name and text.
type File = (&'static str, &'static str);

/// The shipped file a template is made from, and the files written beside it.
fn files(template: Template) -> (&'static str, &'static str, &'static [File]) {
    match template {
        Template::PlanPath => ("pipelines/plan-path.yaml", include_str!("../../pipelines/plan-path.yaml"), &[]),
        Template::Math => ("pipelines/math.yaml", include_str!("../../pipelines/math.yaml"), &[]),
        Template::Code => ("pipelines/code.yaml", include_str!("../../pipelines/code.yaml"), &[]),
        Template::TicTacToe => ("pipelines/tic-tac-toe.yaml", include_str!("../../pipelines/tic-tac-toe.yaml"), &[]),
        Template::Textarena => {
            ("pipelines/textarena-tic-tac-toe.yaml", include_str!("../../pipelines/textarena-tic-tac-toe.yaml"), &[])
        }
        Template::ReasoningGym => (
            "pipelines/reasoning-gym-arithmetic.yaml",
            include_str!("../../pipelines/reasoning-gym-arithmetic.yaml"),
            &[],
        ),
        Template::AgentProgram => (
            "examples/agent_programs/team.yaml",
            include_str!("../../examples/agent_programs/team.yaml"),
            &[
                ("plain_http.py", include_str!("../../examples/agent_programs/plain_http.py")),
                ("arithmetic.jsonl", include_str!("../../examples/agent_programs/arithmetic.jsonl")),
            ],
        ),
    }
}

pub fn run(args: &InitArgs) -> anyhow::Result<()> {
    let (source, text, beside) = files(args.template);
    let file = args.dir.join("iteration.yaml");
    for path in std::iter::once(file.clone()).chain(beside.iter().map(|(name, _)| args.dir.join(name))) {
        if path.exists() {
            return Err(Refused(format!("{} exists; init writes only new files", path.display())).into());
        }
    }
    std::fs::create_dir_all(&args.dir)?;
    let checkout = checkout();
    let header = format!(
        "# Written by `petting init` from {source} of petting {}.\n\
         #   petting config check iteration.yaml      checks it and the files it names\n\
         #   petting pipeline run iteration.yaml      runs it\n\
         # Every key, its type, default and meaning: docs/configuration.md (petting config schema --format markdown).\n\n",
        env!("CARGO_PKG_VERSION"),
    );
    std::fs::write(&file, header + &localised(text, source, checkout.as_deref()))?;
    for (name, text) in beside {
        std::fs::write(args.dir.join(name), text)?;
    }
    println!("wrote {}", file.display());
    for (name, _) in beside {
        println!("wrote {}", args.dir.join(name).display());
    }
    if checkout.is_none() {
        println!("note: the model and dataset paths in it name folders of a petting checkout: point them at yours");
    }
    Ok(())
}

/// The petting checkout this binary was built from, if it is still there: the shipped
/// files' models and datasets are found in it.
fn checkout() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    root.join("pipelines").is_dir().then(|| root.to_path_buf())
}

/// The shipped text with its paths made to work from any folder: the run's store beside
/// the file, the checkout's models, datasets and install scripts by absolute path, and
/// the commands in its comments naming the new file instead of the shipped one.
fn localised(text: &str, source: &str, checkout: Option<&Path>) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let mut line =
            line.replace("../../runs/", "runs/").replace("../runs/", "runs/").replace(source, "iteration.yaml");
        if let Some(root) = checkout {
            line = line.replace(" scripts/install/", &format!(" {}/scripts/install/", root.display()));
            for folder in ["models/", "datasets/"] {
                let absolute = format!("{}/{folder}", root.display());
                line = line.replace(&format!("../../{folder}"), &absolute).replace(&format!("../{folder}"), &absolute);
            }
        }
        out.push_str(&line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_point_into_the_checkout_and_the_store_beside_the_file() {
        let text = "# (first: scripts/install/models.sh smollm2)\n#   petting pipeline run pipelines/math.yaml\n\
                    store: ../runs/math\n    model: ../models/smollm2   # ../models/ again\n  path: ../../datasets/a.jsonl\n";
        let out = localised(text, "pipelines/math.yaml", Some(Path::new("/src/petting")));
        assert_eq!(
            out,
            "# (first: /src/petting/scripts/install/models.sh smollm2)\n#   petting pipeline run iteration.yaml\n\
             store: runs/math\n    model: /src/petting/models/smollm2   # /src/petting/models/ again\n  path: /src/petting/datasets/a.jsonl\n"
        );
        assert!(localised(text, "pipelines/math.yaml", None).contains("model: ../models/smollm2"));
    }
}
