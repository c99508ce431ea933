//! Which candidates form one advantage group, and the reward they are compared on.

use super::Algorithm;

/// How candidates are grouped before their rewards are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// AT-GRPO: the K candidates of one (task, agent, turn) share an identical prompt.
    TaskAgentTurn,
    /// Plain GRPO: everything sampled for one task.
    Task,
}

impl Algorithm {
    pub fn grouping(self) -> Grouping {
        match self {
            Algorithm::AtGrpo | Algorithm::Magrpo | Algorithm::Marloo | Algorithm::Maremax => Grouping::TaskAgentTurn,
            // PPO compares nothing within a group: its groups (a task's independent
            // episodes) are there to be inspected.
            Algorithm::Grpo | Algorithm::DrGrpo | Algorithm::Ppo => Grouping::Task,
        }
    }
}

/// The `groups.group_id` of a candidate.
pub fn group_key(grouping: Grouping, task_id: &str, agent: &str, turn: u32) -> String {
    match grouping {
        Grouping::TaskAgentTurn => format!("{task_id}/t{turn}/{agent}"),
        Grouping::Task => task_id.to_string(),
    }
}

impl Grouping {
    /// [`group_key`] in SQL over `turns`.
    pub fn key_sql(self) -> &'static str {
        match self {
            Grouping::TaskAgentTurn => "concat(task_id, '/t', CAST(turn AS VARCHAR), '/', agent)",
            Grouping::Task => "task_id",
        }
    }

    /// The `groups.agent` and `groups.turn` of a group: its members', or NULL where a
    /// group spans agents and turns.
    pub fn agent_turn_sql(self) -> (&'static str, &'static str) {
        match self {
            Grouping::TaskAgentTurn => ("min(agent)", "min(turn)"),
            Grouping::Task => ("CAST(NULL AS VARCHAR)", "CAST(NULL AS INT UNSIGNED)"),
        }
    }
}

/// r = alpha * r_team + r_local (paper Eq. 4).
pub fn mixed_reward(alpha: f64, team_reward: f64, local_reward: f64) -> f64 {
    alpha * team_reward + local_reward
}

/// [`mixed_reward`] in SQL over `turns`, with alpha as a literal that keeps every bit.
pub fn mixed_reward_sql(alpha: f64) -> String {
    format!("CAST({alpha:?} AS DOUBLE) * team_reward + local_reward")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_grpo_groups_by_task_agent_and_turn_and_grpo_by_task() {
        assert_eq!(group_key(Algorithm::AtGrpo.grouping(), "pp/7", "tool", 2), "pp/7/t2/tool");
        assert_eq!(group_key(Algorithm::Grpo.grouping(), "pp/7", "tool", 2), "pp/7");
        assert_eq!(group_key(Algorithm::Marloo.grouping(), "pp/7", "planner", 0), "pp/7/t0/planner");
    }

    #[test]
    fn the_team_reward_is_weighted_by_alpha() {
        assert_eq!(mixed_reward(1.0, 1.0, 0.5), 1.5);
        assert_eq!(mixed_reward(0.5, 2.0, -0.25), 0.75);
        assert_eq!(mixed_reward(0.0, 9.0, 0.25), 0.25);
    }
}
