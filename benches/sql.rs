//! `petting sql` over a run of one million synthetic `turns` rows in 10 iterations.
//!
//!     cargo bench --bench sql
//!
//! Each measurement opens the run (reads every commit marker, registers the tables)
//! and answers one query, as the CLI does for every command.

#[path = "../tests/support/synthetic.rs"]
mod synthetic;

use criterion::{Criterion, criterion_group, criterion_main};
use petting::sql::RunSql;
use petting::store::RunStore;

const ITERATIONS: u32 = 10;
const ROWS_PER_ITERATION: usize = 100_000;
const PART_ROWS: usize = 50_000;

const QUERIES: [(&str, &str); 3] = [
    (
        "group_by_iteration_agent",
        "select iteration, agent, count(*) as n, avg(local_reward + team_reward) as reward, \
         sum(case when success then 1 else 0 end) as solved \
         from turns group by iteration, agent order by iteration, agent",
    ),
    (
        "group_by_task_agent_turn",
        "select task_id, agent, turn, avg(local_reward) as mean, stddev(local_reward) as std \
         from turns group by task_id, agent, turn",
    ),
    ("pruned_to_last_iteration", "select agent, avg(local_reward) from turns where iteration = 9 group by agent"),
];

fn bench_sql(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let markers = runtime.block_on(synthetic::commit_turns(&store, ITERATIONS, ROWS_PER_ITERATION, PART_ROWS));
    let rows: u64 = markers.iter().map(|m| m.rows()).sum();
    let bytes: u64 = markers.iter().map(|m| m.bytes()).sum();
    eprintln!(
        "run of {rows} turns rows in {} files, {:.1} MiB",
        markers.iter().map(|m| m.files.len()).sum::<usize>(),
        bytes as f64 / 1048576.0
    );

    let mut group = c.benchmark_group("sql_1m_turns");
    group.sample_size(20);
    for (name, query) in QUERIES {
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter(|| async {
                let sql = RunSql::open(&store).await.unwrap();
                sql.query(query).await.unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_sql);
criterion_main!(benches);
