#pragma once
#include <cstdint>

namespace sluice {

/// The plugin ABI: a host loads a plugin whose major equals its own and whose minor is not newer.
/// Raise the minor for additions that old plugins need not know about; raise the major (and reset
/// the minor) for any change to an existing type, virtual function or descriptor field.
inline constexpr std::uint32_t kAbiMajor = 6;
/// 2.0: cursor-based Expand with DamageReport; 3.0: parameter hints, the keeps_shape
/// trait, shared sample origins, Source::expected_elements; 4.0: offered allocators, cancel(),
/// feed sinks (Sink::feed, Sink::device_counters), placement (map-and-batch); 4.1: ParamType::OutputPath,
/// StageInfo::input_fingerprint (appended; older plugins never read it); 4.2: ParamType::PathList, and
/// relative Path, OutputPath and PathList values resolved against the pipeline file's folder;
/// 5.0: OperatorKind::Combine (several inputs: Combine, CombineInputs), OperatorInfo::min_inputs and
/// max_inputs (a field added to a struct plugins build), and outputs read by several stages: a tensor
/// an operator is given may be shared with another reader, so operators build new tensors rather
/// than write into the ones they get; 6.0: checkpoints: Operator::save_state/restore_state with
/// StateWriter/StateReader (state.hpp), OperatorTraits::saves_state, ExpandCursor::seek,
/// Origin::read_epoch/read_index
/// (new virtual functions and a descriptor field); Combine makes one output per next() call, after
/// begin_iteration(), instead of one iteration per combine() call; 6.1: StageCounters and
/// StageInfo::counters (appended; plugins built for 6.0 never read it); 6.2: chunks (chunk.hpp:
/// Chunk, ChunkedExpandCursor, ChunkedMap, ChunkedAggregate, RowError: new classes an operator may
/// also derive from; the host finds them with dynamic_cast, so older plugins are run element-wise);
/// 6.3: Column::Layout::Ragged and Column's row_* readers (a chunk column of rows of different
/// lengths: the host hands such chunks only to operators of plugins built for 6.3 or later);
/// 6.4: AssemblesInParallel and ParallelAssembly (operator.hpp: new classes, found with
/// dynamic_cast; an aggregate of an older plugin keeps assembling its outputs on its own thread);
/// 6.5: HandsOnItsInputs (operator.hpp: a new class, found with dynamic_cast) and SchemaMismatch
/// (error.hpp: a DataError an older host takes as one); 6.6: remote storage (storage.hpp: Storage,
/// RemoteReader, StoredObject) and StageInfo::storage (appended; older plugins never read it);
/// 6.7: ResumesOnOtherWorkers, HoldsOnlyElements and StacksItsInputs (operator.hpp: new classes, found with
/// dynamic_cast; without them a checkpoint resumes only on as many workers as took it);
/// 6.8: OperatorTraits::role (OperatorRole, in the bytes after the four flags that were padding:
/// OperatorInfo's layout is unchanged, and the host reads a role only from plugins built for 6.8);
/// 6.9: a source may be resumed before a pass with the state it saved later, inside another pass
/// (Source::begin_pass() begins the pass it names, whatever state was restored): the host does so
/// only with sources of plugins built for 6.9, and cuts older ones at their own place; 6.10:
/// OperatorRole::Repeats (a new role value: the host passes such an aggregate's inputs through,
/// chunks whole, only for plugins built for 6.10); 6.11: ReadsRecordsAgain (operator.hpp: a new
/// class, found with dynamic_cast; without it a source's elements held at a cut are kept by value);
/// 6.12: TimesDeviceCopies (feed.hpp: a new class, found with dynamic_cast; without it a feed's
/// devices report no copy time); 6.13: origin_rows.hpp (OriginRecords: the records an element made
/// of several names, carried in its origin's `where`; header-only, an older plugin's elements name
/// their first record only); 6.14: ReadsByPosition (operator.hpp: a new class, found with
/// dynamic_cast; without it a source cannot back the Python module's data sources).
inline constexpr std::uint32_t kAbiMinor = 14;

}  // namespace sluice
