//! Merging blocks: the records of several blocks of one tenant and signal
//! rewritten as one hot block (the compactor's hot merge). Each input's
//! tables are turned back into OTLP and appended to a fresh builder, so
//! resources, scopes and series repeated across inputs are stored once in
//! the output, and its sidecars (zone maps, attribute index, id filters)
//! are built anew over all its rows. Records keep their order: the rows of
//! the first input, then the second's, and so on.

use bytes::Bytes;

use crate::block::Block;
use crate::convert::{
    LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet, logs_to_otlp, points_to_otlp, spans_to_otlp,
};
use crate::tables::{read_tables, write_hot};
use crate::{BlockId, Error, Signal};

/// The merged tables of `inputs`, which must share one tenant and signal.
pub fn merge_tables(inputs: &[Block]) -> Result<TableSet, Error> {
    let Some(first) = inputs.first() else {
        return Err(Error::Merge("no input blocks".into()));
    };
    let (tenant, signal) = (&first.meta().tenant, first.meta().signal);
    for b in inputs {
        let m = b.meta();
        if &m.tenant != tenant || m.signal != signal {
            return Err(Error::Merge(format!(
                "block {} is {}/{}, block {} is {}/{}",
                first.meta().block_id,
                tenant.as_str(),
                signal,
                m.block_id,
                m.tenant.as_str(),
                m.signal
            )));
        }
    }
    match signal {
        Signal::Logs => merge_with::<LogsBuilder>(inputs, |t| Ok(logs_to_otlp(t)?)),
        Signal::Traces => merge_with::<SpansBuilder>(inputs, |t| Ok(spans_to_otlp(t)?)),
        Signal::Metrics => merge_with::<PointsBuilder>(inputs, |t| Ok(points_to_otlp(t)?)),
    }
}

fn merge_with<B: SignalBuilder>(
    inputs: &[Block],
    to_otlp: impl Fn(&TableSet) -> Result<B::Request, Error>,
) -> Result<TableSet, Error> {
    let mut builder = B::default();
    for b in inputs {
        let tables = read_tables(b, None)?;
        builder.append(&to_otlp(&tables)?)?;
    }
    Ok(builder.finish()?)
}

/// `inputs` merged into one hot block with id `id`: the whole object,
/// ready for one PUT.
pub fn merge_blocks(inputs: &[Block], id: BlockId) -> Result<Bytes, Error> {
    let tables = merge_tables(inputs)?;
    let tenant = inputs[0].meta().tenant.clone();
    write_hot(&tables, id, tenant)
}
