//! The charts of a run, each a query over its committed tables with columns `x` (the
//! iteration), `series` and `y`: the report draws them as PNGs, the dashboard live.

use std::ops::Range;

/// One chart: a query with columns `x` (the iteration), `series` and `y`.
pub struct Panel {
    /// The report's PNG of it, and the dashboard's id (the name without `.png`).
    pub file: &'static str,
    pub title: &'static str,
    pub x_label: &'static str,
    pub y_label: &'static str,
    pub y_range: Option<Range<f64>>,
    pub query: &'static str,
}

/// The run's charts, in the order the report and the dashboard show them.
pub fn panels() -> Vec<Panel> {
    vec![
        Panel {
            file: "eval-success.png",
            title: "Held-out success per policy version and mode",
            x_label: "policy version",
            y_label: "success rate",
            // A little room so lines at 0% and 100% stay clear of the frame.
            y_range: Some(-0.02..1.02),
            query: "SELECT iteration AS x, mode AS series, avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS y \
                    FROM evals GROUP BY iteration, mode",
        },
        Panel {
            file: "reward.png",
            title: "Mean local reward per agent and turn (every candidate)",
            x_label: "iteration",
            y_label: "local reward",
            y_range: None,
            query: "SELECT iteration AS x, agent || ' turn ' || CAST(turn AS VARCHAR) AS series, avg(local_reward) AS y \
                    FROM turns GROUP BY iteration, agent, turn",
        },
        Panel {
            file: "train-success.png",
            title: "Training success: finished episodes of each rollout that succeeded",
            x_label: "iteration",
            y_label: "success rate",
            y_range: Some(-0.02..1.02),
            query: "SELECT iteration AS x, 'rollout' AS series, avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS y \
                    FROM turns WHERE done GROUP BY iteration",
        },
        Panel {
            file: "team-reward.png",
            title: "Mean team reward of the finished episodes",
            x_label: "iteration",
            y_label: "team reward",
            y_range: None,
            query: "SELECT iteration AS x, 'team' AS series, avg(team_reward) AS y FROM turns WHERE done GROUP BY iteration",
        },
        Panel {
            file: "league.png",
            title: "League: the trained policy's mean result against each past version (evaluation.against)",
            x_label: "policy version",
            y_label: "mean team reward",
            y_range: None,
            query: "SELECT iteration AS x, 'against v' || CAST(opponent_version AS VARCHAR) AS series, avg(reward) AS y \
                    FROM evals WHERE mode = 'league' GROUP BY iteration, opponent_version",
        },
        Panel {
            file: "response-length.png",
            title: "Mean response length per agent",
            x_label: "iteration",
            y_label: "tokens",
            y_range: None,
            query: "SELECT iteration AS x, agent AS series, avg(cardinality(response_tokens)) AS y \
                    FROM turns GROUP BY iteration, agent",
        },
        Panel {
            file: "loss.png",
            title: "Loss per policy and update mode (ppo, critic, sft: the warm start)",
            x_label: "iteration",
            y_label: "loss (mean over steps)",
            y_range: None,
            query: "SELECT iteration AS x, policy || ' ' || mode AS series, avg(loss) AS y \
                    FROM updates GROUP BY iteration, policy, mode",
        },
        Panel {
            file: "entropy.png",
            title: "Policy entropy per token (mean over steps)",
            x_label: "iteration",
            y_label: "nats",
            y_range: None,
            query: "SELECT iteration AS x, policy AS series, avg(entropy) AS y \
                    FROM updates WHERE mode = 'ppo' AND entropy IS NOT NULL GROUP BY iteration, policy",
        },
        Panel {
            file: "kl.png",
            title: "Approximate KL between the sampling and the updated policy (mean over steps)",
            x_label: "iteration",
            y_label: "KL",
            y_range: None,
            query: "SELECT iteration AS x, policy AS series, avg(approx_kl) AS y \
                    FROM updates WHERE mode = 'ppo' AND approx_kl IS NOT NULL GROUP BY iteration, policy",
        },
        Panel {
            file: "learning-rate.png",
            title: "Learning rate per policy (last step of each update)",
            x_label: "iteration",
            y_label: "learning rate",
            y_range: None,
            query: "SELECT iteration AS x, policy AS series, max(learning_rate) AS y \
                    FROM updates WHERE mode = 'ppo' GROUP BY iteration, policy",
        },
        Panel {
            file: "clip-fraction.png",
            title: "PPO clip fraction per policy (mean over steps)",
            x_label: "iteration",
            y_label: "fraction of tokens clipped",
            y_range: None,
            query: "SELECT iteration AS x, policy AS series, avg(clip_fraction) AS y \
                    FROM updates WHERE mode = 'ppo' GROUP BY iteration, policy",
        },
        Panel {
            file: "logprob-drift.png",
            title: "Logprob drift between rollout and update, per policy",
            x_label: "iteration",
            y_label: "|logprob difference|",
            y_range: None,
            query: "SELECT iteration AS x, policy || ' mean' AS series, avg(logprob_drift_mean) AS y \
                    FROM updates WHERE mode = 'ppo' GROUP BY iteration, policy \
                    UNION ALL SELECT iteration, policy || ' max', max(logprob_drift_max) \
                    FROM updates WHERE mode = 'ppo' GROUP BY iteration, policy",
        },
        Panel {
            file: "mismatch.png",
            title: "Sampler/trainer mismatch: tokens whose probability ratio is outside [0.9, 1.1]",
            x_label: "iteration",
            y_label: "fraction of tokens",
            y_range: None,
            query: "SELECT iteration AS x, policy AS series, avg(mismatch_fraction) AS y \
                    FROM updates WHERE mode = 'ppo' AND mismatch_fraction IS NOT NULL GROUP BY iteration, policy",
        },
        Panel {
            file: "grad-norm.png",
            title: "Gradient norm per policy (mean over steps, before clipping)",
            x_label: "iteration",
            y_label: "L2 norm",
            y_range: None,
            query: "SELECT iteration AS x, policy AS series, avg(grad_norm) AS y \
                    FROM updates WHERE mode = 'ppo' GROUP BY iteration, policy",
        },
        Panel {
            file: "stage-seconds.png",
            title: "Wall time per stage",
            x_label: "iteration",
            y_label: "seconds",
            y_range: None,
            query: "SELECT iteration AS x, stage AS series, sum(seconds) AS y \
                    FROM commits WHERE iteration IS NOT NULL GROUP BY iteration, stage",
        },
    ]
}

/// Every commit as a span of seconds from the run's first start, with its lane.
pub const SPANS: &str = "WITH spans AS (SELECT stage, iteration, \
       CASE WHEN stage IN ('rollout', 'evaluate') THEN 'sample' ELSE 'train' END AS lane, \
       (CAST(started_at AS BIGINT) - t0) / 1e6 AS start_s, (CAST(finished_at AS BIGINT) - t0) / 1e6 AS end_s \
     FROM commits, (SELECT min(CAST(started_at AS BIGINT)) AS t0 FROM commits))";

/// Seconds in which a sampling and a training stage ran at once, and the run's span. A
/// lane's spans are merged first: rollout shards, or an evaluation beside a rollout, run
/// at once within the sample lane and would otherwise count their common seconds twice.
pub const OVERLAP: &str = ", ordered AS (SELECT lane, start_s, end_s, max(end_s) OVER (PARTITION BY lane \
       ORDER BY start_s, end_s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach FROM spans), \
     islands AS (SELECT lane, start_s, end_s, sum(CASE WHEN reach IS NULL OR start_s > reach THEN 1 ELSE 0 END) \
       OVER (PARTITION BY lane ORDER BY start_s, end_s ROWS UNBOUNDED PRECEDING) AS island FROM ordered), \
     merged AS (SELECT lane, min(start_s) AS start_s, max(end_s) AS end_s FROM islands GROUP BY lane, island) \
     SELECT round(coalesce(sum(greatest(0.0, least(s.end_s, t.end_s) - greatest(s.start_s, t.start_s))), 0), 1) \
       AS beside_s, (SELECT round(max(end_s), 1) FROM spans) AS run_s \
     FROM merged s JOIN merged t ON s.lane = 'sample' AND t.lane = 'train'";
