use petting::config::{self, LoadedConfig};

use super::args::{ConfigArgs, SchemaFormat};

/// The file validated with its `--set` keys, and as a fork with `--from`.
fn load(args: &ConfigArgs) -> anyhow::Result<LoadedConfig> {
    let mut draft = config::read(&args.config, &args.overrides)?;
    if let Some(fork) = &args.from {
        draft.set_fork(fork.clone());
    }
    Ok(draft.validate()?)
}

pub fn check(args: &ConfigArgs) -> anyhow::Result<()> {
    let loaded = load(args)?;
    let file = &args.config;
    // The typed error stays in the chain: the exit status reads it (refused, 3).
    let inputs = petting::pipeline::inputs::check(&loaded.resolved()).map_err(|e| {
        let message = format!("{}: {e}", file.display());
        anyhow::Error::new(e).context(message)
    })?;
    for renamed in &loaded.renamed {
        println!("{}: warning: {renamed}", file.display());
    }
    let c = &loaded.config;
    if let Some(ranks) = args.ranks {
        super::ranks::check_pools(c, ranks, file)?;
    }
    let agents: Vec<String> = c
        .agents
        .iter()
        .map(|(role, a)| match a.league {
            Some(league) => format!("{role} -> {} (a past version: {})", a.policy, league.rule()),
            None => format!("{role} -> {}", a.policy),
        })
        .collect();
    println!(
        "{}: ok: {} played by {:?} ({}), {} train and {} test tasks, {} iterations of {} tasks x K={}, store {}, \
         config sha256 {}",
        file.display(),
        c.env.name(),
        c.workflow.kind,
        agents.join(", "),
        inputs.train_tasks,
        inputs.test_tasks,
        c.iterations,
        c.rollout.tasks_per_iteration,
        c.rollout.group_size(),
        c.store,
        &c.sha256()[..12]
    );
    Ok(())
}

pub fn show(args: &ConfigArgs) -> anyhow::Result<()> {
    let loaded = load(args)?;
    print!("{}", serde_saphyr::to_string(&loaded.config)?);
    Ok(())
}

pub fn schema(format: SchemaFormat) -> anyhow::Result<()> {
    match format {
        SchemaFormat::Json => println!("{}", serde_json::to_string_pretty(&config::reference::json_schema())?),
        SchemaFormat::Markdown => print!("{}", config::reference::markdown()),
    }
    Ok(())
}
