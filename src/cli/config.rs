use std::path::Path;

use petting::config;

pub fn check(file: &Path) -> anyhow::Result<()> {
    let loaded = config::load(file)?;
    let c = &loaded.config;
    let agents: Vec<String> = c.agents.iter().map(|(role, a)| format!("{role} -> {}", a.policy)).collect();
    println!(
        "{}: ok: {} played by {:?} ({}), {} iterations of {} tasks x K={}, store {}, config sha256 {}",
        file.display(),
        c.env.name(),
        c.workflow.kind,
        agents.join(", "),
        c.iterations,
        c.rollout.tasks_per_iteration,
        c.rollout.k,
        c.store,
        &c.sha256()[..12]
    );
    Ok(())
}

pub fn show(file: &Path) -> anyhow::Result<()> {
    let loaded = config::load(file)?;
    print!("{}", serde_saphyr::to_string(&loaded.config)?);
    Ok(())
}
