//! `petting ui [RUNS…]`: the dashboard, served until Ctrl-C.

use petting::ui::{self, Dashboard};

use super::args::UiArgs;

pub async fn run(args: UiArgs) -> anyhow::Result<()> {
    let dashboard = Dashboard::new(args.runs.clone()).await?;
    if dashboard.run_count().await? == 0 {
        eprintln!("note: no runs under {} yet; they appear as they start", args.runs.join(", "));
    }
    let listener = ui::bind(&args.host, args.port).await?;
    // The first line is the address, for people and for scripts that start it.
    println!("petting ui: http://{}/", listener.local_addr()?);
    tokio::select! {
        () = ui::serve(listener, dashboard) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
