//! `dlq plan`: freezes a reviewed, homogeneous selection as JSON on stdout (`-q`: its
//! IDs alone, one per line, to look at before the plan is made for real).

use super::filters::FilterArgs;
use super::output::say;
use super::output::thousands;
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::error::DlqError;
use dlq::model::State;
use dlq::plan::{make_plan, Mix};

/// `dlq plan --help`.
const EXAMPLES: &str = "Examples:
  # Freeze one homogeneous group for review, then replay exactly it
  dlq plan --reason retries_exhausted --producer inventory --schema-version 5 > inventory-plan.json
  # The last two hours of one source queue, at most 500 items
  dlq plan --source-queue payments.settle --since 2h --limit 500 > payments-plan.json
  # Dead letters whose error names one cause
  dlq plan --error-contains \"unsupported country XX\" > xx-plan.json";

#[derive(Debug, Args)]
#[command(after_long_help = EXAMPLES)]
pub struct PlanArgs {
    #[command(flatten)]
    pub filters: FilterArgs,
    /// At most this many dead letters, oldest first
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub limit: i64,
    /// Accept a selection that mixes reasons, producers or schema versions
    #[arg(long)]
    pub allow_mixed: bool,
    /// Print the selected IDs only, one per line, instead of the plan
    #[arg(short, long)]
    pub quiet: bool,
}

pub async fn run(ctx: &Ctx, args: PlanArgs) -> Result<u8> {
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let mut filter = args.filters.resolve(store.as_ref()).await?;
    // A plan replays pending rows only: say so rather than plan what cannot be replayed.
    match filter.states.as_slice() {
        [] => filter.states = vec![State::Pending],
        [State::Pending] => {}
        _ => {
            return Err(DlqError::usage(
                "a plan selects pending dead letters only (--state pending, the default); uncertain ones are settled with `dlq resolve`, discarded ones with `dlq restore`",
            ).into())
        }
    }
    let plan = match make_plan(
        store.as_ref(),
        filter,
        args.limit,
        match args.allow_mixed {
            true => Mix::Allow,
            false => Mix::Refuse,
        },
        &operator,
    )
    .await
    {
        Ok(plan) => plan,
        Err(e) => {
            // Nothing to plan because of a typo: say which values exist.
            args.filters.hint_unmatched(store.as_ref()).await;
            return Err(e.into());
        }
    };
    store.close().await;
    if args.quiet {
        plan.items.iter().for_each(|i| ctx.out.id_line(&i.id));
        ctx.out.check()?;
        return Ok(dlq::exit::OK);
    }
    ctx.out.json(&plan);
    ctx.out.check()?;
    let matched = plan.matched.unwrap_or(plan.count);
    if matched > plan.count {
        say(&format!(
            "plan {}: {} of {} dead letters (raise --limit); review it, then `dlq replay --plan FILE`",
            plan.plan_id,
            thousands(plan.count as i64),
            thousands(matched as i64)
        ));
    } else {
        say(&format!(
            "plan {}: {} dead letters; review it, then `dlq replay --plan FILE`",
            plan.plan_id,
            thousands(plan.count as i64)
        ));
    }
    Ok(dlq::exit::OK)
}
