//! The rules of a run file that span sections (every role has an agent, every agent's
//! policy exists, a training rollout's sampling fits the update, …), after each section's
//! own checks: what [`RunConfig::validate`] refuses before any stage meets the config.

use std::path::Path;

use crate::algo::{Credit, Grouping};
use crate::engine::EngineKind;
use crate::envs::{EnvConfig, EnvSource};
use crate::play::RolloutMode;
use crate::policies::{LeagueRule, ModelInit};
use crate::validate::{Invalid, check};
use crate::workflows::{ALONE_OVER_TURNS, WorkflowKind};

use super::{EvalMode, RunConfig, pools};

impl RunConfig {
    /// Every section's own checks, then the rules that span sections. Returns the key
    /// path and the problem.
    pub fn validate(&self) -> Result<(), Invalid> {
        check(!self.store.trim().is_empty(), "store", "is empty; give a local path or a URL such as s3://bucket/run")?;
        self.validate_workflow()?;
        self.limits.validate()?;
        self.data.validate(&self.env)?;
        self.env.validate()?;
        self.validate_agents()?;
        for (name, policy) in &self.policies {
            let key = format!("policies.{name}");
            policy.validate(&key)?;
            check(
                policy.init != ModelInit::Scratch || !self.env.source().host_makes_tasks(),
                format!("{key}.init"),
                "a model from scratch takes its tokenizer from the prompts prepare-data writes, and a hosted \
                 environment's prompts come from its host as it plays: start from a pretrained model",
            )?;
            check(
                policy.init != ModelInit::Scratch || policy.lora.is_none() || self.fork.is_some(),
                format!("{key}.lora"),
                "a LoRA adapter needs a pretrained base: use init: pretrained, or fork the run from a \
                 warm-started one (--from runs/plan-path@0), or drop lora",
            )?;
        }
        check(
            self.policies.values().any(|p| p.trainable),
            "policies",
            "are all frozen (trainable: false): nothing would train; let at least one policy train",
        )?;
        pools::validate(&self.pools, &self.policies)?;
        self.rollout.validate(self.data.train_tasks)?;
        self.algorithm.validate()?;
        self.validate_critic()?;
        self.update.validate()?;
        self.evaluation.validate(self.data.test_tasks)?;
        self.validate_evaluation_modes()?;
        self.validate_engine()?;
        self.validate_league()?;
        self.validate_training_rollout()?;
        if let Some(retention) = &self.retention {
            retention.validate("retention")?;
            let staleness = self.rollout.max_staleness;
            check(
                !retention.weights || retention.keep_last > staleness,
                "retention.keep_last",
                format!(
                    "is {}, but rollout.max_staleness {staleness} samples with versions up to {staleness} behind \
                     the newest: keep at least {} whole",
                    retention.keep_last,
                    staleness + 1
                ),
            )?;
        }
        if let Some(fork) = &self.fork {
            check(!fork.from.trim().is_empty(), "fork.from", "is empty; give the source run's path or URL")?;
            check(
                fork.iteration <= self.iterations,
                "fork.iteration",
                format!("is {}, past the run's last iteration ({})", fork.iteration, self.iterations),
            )?;
        }
        if let Some(warm) = &self.warm_start {
            check(
                matches!(self.env.source(), EnvSource::Generated(_)),
                "warm_start",
                "demonstrations exist for plan_path, sudoku, sokoban and tic_tac_toe; math and code start from a pretrained model",
            )?;
            warm.validate()?;
        }
        Ok(())
    }

    fn validate_workflow(&self) -> Result<(), Invalid> {
        let (kind, env) = (self.workflow.kind, self.env.name());
        let playing = WorkflowKind::playing(env);
        check(
            kind.plays(env) || kind != WorkflowKind::Environment,
            "workflow.kind",
            format!("is not set, and {env} does not say whose turn it is: choose one of {playing:?}"),
        )?;
        check(kind.plays(env), "workflow.kind", format!("{kind:?} cannot play {env}; it takes {playing:?}"))?;
        check(self.workflow.max_turns >= 1, "workflow.max_turns", "must be at least 1")?;
        check(
            !self.workflow.alone || kind.can_act_alone(),
            "workflow.alone",
            format!("only tool_planner's agents can act alone; in {kind:?} each agent's turn needs the other's"),
        )?;
        check(!self.workflow.alone || self.workflow.max_turns == 1, "workflow.alone", ALONE_OVER_TURNS)?;
        // The joint program is judged in one step, by the hidden tests.
        check(
            kind != WorkflowKind::CodeCollab || !matches!(&self.env, EnvConfig::Code(code) if code.reward.is_some()),
            "env.reward",
            "code_collab scores the helper's and the main agent's joint program with the hidden tests; a reward \
             function scores one agent's program (use coder_tester or single_agent with it)",
        )
    }

    fn validate_agents(&self) -> Result<(), Invalid> {
        let agents = &self.team();
        for agent in agents {
            check(
                self.agents.contains_key(agent),
                "agents",
                format!("the {:?} workflow needs an agent `{agent}`", self.workflow.kind),
            )?;
        }
        for (agent, played) in &self.agents {
            let names: Vec<&str> = agents.iter().map(|a| a.as_str()).collect();
            check(
                agents.contains(agent),
                format!("agents.{agent}"),
                format!("is not an agent of {:?}, whose agents are {names:?}", self.workflow.kind),
            )?;
            let known: Vec<&String> = self.policies.keys().collect();
            check(
                self.policies.contains_key(&played.policy),
                format!("agents.{agent}.policy"),
                format!("names no policy `{}`; the policies are {known:?}", played.policy),
            )?;
        }
        for name in self.policies.keys() {
            check(
                self.agents.values().any(|a| &a.policy == name),
                format!("policies.{name}"),
                "is played by no agent",
            )?;
        }
        Ok(())
    }

    /// A training rollout whose groups and logprobs the update can use.
    fn validate_training_rollout(&self) -> Result<(), Invalid> {
        let sampling = &self.rollout.sampling;
        check(
            sampling.top_p >= 1.0 && sampling.top_k == 0,
            "rollout.sampling",
            "top_p and top_k are for evaluation.sampling: a training rollout samples from the whole \
             distribution at its temperature, the distribution whose logprobs the rows store and the update \
             trains; with top_p/top_k the tokens would come from another one",
        )?;
        // Independent episodes share a prompt only at the first turn of the first agent:
        // grouping their later turns by (task, agent, turn) compares different prompts.
        let one_prompt = self.team().len() == 1 && self.workflow.max_turns == 1;
        let program = matches!(self.env.source(), EnvSource::AgentProgram(_));
        check(
            !program || self.rollout.mode == RolloutMode::Independent,
            "rollout.mode",
            "an agent program cannot be forked mid-episode, so it plays independent episodes: write \
             rollout.mode: independent and rollout.episodes_per_task: K (the group of each task)",
        )?;
        self.validate_credit()?;
        // An agent program's calls are grouped as its estimator says, by (task, agent,
        // call index) for at_grpo: the nearest to a turn's group that independent
        // episodes have (their prompts agree at each role's first call).
        check(
            program
                || self.rollout.mode != RolloutMode::Independent
                || self.algorithm.name.grouping() != Grouping::TaskAgentTurn
                || one_prompt,
            "rollout.mode",
            format!(
                "independent episodes with {} group each (task, agent, turn) across the K episodes, but after \
                 the first turn each episode's prompt differs; use rollout.mode: tree (AT-GRPO's sampling, where \
                 the K candidates of a turn share their prompt), or an estimator that groups by task (grpo, dr_grpo)",
                self.algorithm.name.label()
            ),
        )
    }

    /// A vLLM engine needs its server, and one server serves one base model.
    fn validate_engine(&self) -> Result<(), Invalid> {
        let uses_vllm = [("rollout.engine", self.rollout.engine), ("evaluation.engine", self.evaluation.engine)]
            .into_iter()
            .find(|(_, engine)| *engine == EngineKind::Vllm);
        let Some((key, _)) = uses_vllm else { return Ok(()) };
        let Some(vllm) = &self.vllm else {
            return check(false, key, "is vllm, but the config has no vllm: section (at least vllm.url)");
        };
        vllm.validate()?;
        let models: std::collections::BTreeSet<&Path> = self.policies.values().map(|p| p.model.as_path()).collect();
        let full = self.policies.values().filter(|p| p.lora.is_none()).count();
        check(
            models.len() == 1 && (full == 0 || self.policies.len() == 1),
            key,
            "one vLLM server serves one base model: give every policy a LoRA adapter on the same model, or use \
             a single full-weight policy",
        )
    }

    /// A league's roles play stored past versions of a policy that trains, on the tch
    /// engine, and some role still trains; then `evaluation.against`.
    fn validate_league(&self) -> Result<(), Invalid> {
        let first = self.first_iteration();
        let leagues: Vec<_> = self.agents.iter().filter_map(|(role, a)| Some((role, a, a.league?))).collect();
        for &(role, agent, league) in &leagues {
            let key = format!("agents.{role}.league");
            league.validate(&key)?;
            check(
                self.policies.get(&agent.policy).is_none_or(|p| p.trainable),
                &key,
                format!("plays past versions of {}, which is frozen (trainable: false) and has only one", agent.policy),
            )?;
            let rule = league.rule();
            if let LeagueRule::Version(v) = rule {
                check(
                    v == first,
                    &key,
                    format!(
                        "plays version {v}, which is not stored when the first rollout (iteration {first}) samples; \
                         a league plays versions stored before its rollout: version {first} (the starting policy), \
                         or behind, uniform or toward_losses"
                    ),
                )?;
            }
            let reach = rule.reach().unwrap_or(0);
            check(
                self.retention.is_none_or(|r| !r.weights || r.keep_last > reach),
                "retention.keep_last",
                format!(
                    "must be more than {reach}: {key} plays versions up to {reach} behind the newest, whose \
                     weights retention.weights would prune"
                ),
            )?;
            check(
                self.rollout.engine == EngineKind::Tch,
                "rollout.engine",
                format!("is vllm, which serves only the current version; {key} samples past ones: use the tch engine"),
            )?;
        }
        check(
            self.agents
                .values()
                .any(|a| a.league.is_none() && self.policies.get(&a.policy).is_some_and(|p| p.trainable)),
            "agents",
            "every role that plays a trained policy plays a past version of it (league): nothing would train",
        )?;
        self.validate_evaluation_against(!leagues.is_empty())
    }

    /// `evaluation.against`: versions the run stores and keeps, played by a league's roles
    /// on the tch engine.
    fn validate_evaluation_against(&self, has_league: bool) -> Result<(), Invalid> {
        let first = self.first_iteration();
        let kept = |v: u32| match &self.retention {
            Some(r) if r.weights => v == first || r.keep_every.is_some_and(|n| v.is_multiple_of(n)),
            _ => true,
        };
        let against = &self.evaluation.against;
        if against.is_empty() {
            return Ok(());
        }
        check(
            has_league,
            "evaluation.against",
            "plays past versions in the league's roles, and no agent has a league: give the role that plays them \
             agents.<role>.league",
        )?;
        check(
            self.evaluation.engine == EngineKind::Tch,
            "evaluation.engine",
            "is vllm, which serves only the current version; evaluation.against plays past ones: use the tch engine",
        )?;
        for &v in against {
            check(
                (first..=self.iterations).contains(&v),
                "evaluation.against",
                format!("names version {v}; this run stores versions {first} to {}", self.iterations),
            )?;
            check(kept(v), "evaluation.against", format!("names version {v}, whose weights retention.weights prunes"))?;
        }
        Ok(())
    }

    /// The modes that need a workflow of a certain shape.
    fn validate_evaluation_modes(&self) -> Result<(), Invalid> {
        let modes = &self.evaluation.modes;
        let kind = self.workflow.kind;
        check(
            !modes.contains(&EvalMode::Swapped) || self.team().len() == 2,
            "evaluation.modes",
            "swapped needs a workflow with two agents",
        )?;
        check(
            kind != WorkflowKind::Environment || !modes.contains(&EvalMode::SingleAgent),
            "evaluation.modes",
            "single_agent plays an environment's single-agent workflow, which a hosted environment has not: \
             use modes: [multi_agent]",
        )?;
        let alone = modes.iter().any(|m| matches!(m, EvalMode::Alone | EvalMode::ToolAlone));
        check(
            !alone || kind.can_act_alone(),
            "evaluation.modes",
            "alone and tool_alone need the tool_planner workflow",
        )?;
        check(!alone || self.workflow.max_turns == 1, "evaluation.modes", ALONE_OVER_TURNS)
    }

    /// PPO's critic: present exactly with ppo, over whole trajectories, crediting by GAE
    /// alone, with every sample kept.
    fn validate_critic(&self) -> Result<(), Invalid> {
        let ppo = self.algorithm.name.needs_critic();
        let Some(critic) = &self.critic else {
            return check(!ppo, "algorithm.name", "ppo needs a critic: section (critic: {} takes every default)");
        };
        critic.validate()?;
        check(ppo, "critic", "is the critic of algorithm.name: ppo; the group estimators have none")?;
        check(
            self.rollout.mode == RolloutMode::Independent,
            "rollout.mode",
            "ppo runs GAE along each episode, and a tree continues only one candidate per node: write \
             rollout.mode: independent",
        )?;
        check(
            self.algorithm.credit == Credit::Turn,
            "algorithm.credit",
            "ppo's GAE already carries each agent's later rewards back along its turns: leave credit at turn",
        )?;
        let filter = &self.algorithm.filter;
        check(
            !filter.drop_degenerate && filter.drop_lowest_mean_fraction == 0.0,
            "algorithm.filter",
            "ppo has no groups to filter: a sample's advantage is against its critic's value",
        )?;
        check(
            self.workflow.kind != WorkflowKind::TwoPlayers || self.algorithm.alpha == 0.0,
            "algorithm.alpha",
            "two_players records each mover's own result as its team_reward, so GAE would hand the last \
             mover's result to both players; write algorithm.alpha: 0",
        )?;
        let frozen = self.policies.iter().find(|(_, p)| !p.trainable).map(|(name, _)| name);
        check(
            frozen.is_none(),
            "algorithm.name",
            format!(
                "ppo fits a critic head on every policy, and {} is frozen (trainable: false); use a group \
                 estimator (at_grpo, grpo, …) beside a frozen agent",
                frozen.map_or("", String::as_str)
            ),
        )
    }

    /// Returns need whole trajectories, and a team reward every agent shares.
    fn validate_credit(&self) -> Result<(), Invalid> {
        // A tree continues one candidate per node: the others' episodes end there, with
        // no return to credit them with.
        check(
            self.algorithm.credit != Credit::Return || self.rollout.mode == RolloutMode::Independent,
            "algorithm.credit",
            "return credits each candidate with the rest of its episode, and a tree continues only one \
             candidate per node; write rollout.mode: independent with an estimator that groups by task \
             (grpo, dr_grpo), or credit: turn",
        )?;
        // two_players' team_reward is each mover's own result, not a shared one.
        check(
            self.algorithm.credit != Credit::Return
                || self.workflow.kind != WorkflowKind::TwoPlayers
                || self.algorithm.alpha == 0.0,
            "algorithm.alpha",
            "two_players records each mover's own result as its team_reward, so credit: return would hand the \
             last mover's result to both players; write algorithm.alpha: 0, and each player's return is its own \
             move rewards (a win 1, a draw 0.5, an illegal move -1)",
        )
    }
}
