// Package definition reads feature definition files and compiles them over a
// user's Avro writer schema into a codec.Decoder.
//
// A definition (YAML or JSON, docs/features.md) maps the user's record onto a
// transaction (dot paths for the event id, entity key, event time and amount),
// names the windows, and declares features: count, sum, min, max and
// distinct_count, each optionally restricted by a filter (an AND of
// predicates on the record's fields). Parse validates the file and reports
// every error as "file:line: field: what"; Compile resolves every path against
// one writer schema and fails on a path the schema lacks or a type a use
// cannot take, so such mistakes stop the service at start instead of
// dead-lettering every record.
//
// A definition may also declare re-keyed groups (Definition.Groups): features
// kept per another field than input.entity_id, each with its own windows,
// filters and distinct slots. The decoder reads every group's key and words
// in the same walk into tx.Groups; computing them (through a repartition
// topic, docs/repartition.md) is the pipeline's. EngineSpecs describes every
// group for the engine.
//
// The compiled decoder is on the per-record hot path: a hand-written Avro
// walker that reads only the mapped fields and steps over the rest, without
// allocating beyond the two id strings and the present group keys. It fills
// codec.Transaction (amounts exactly in minor units, event time in
// milliseconds) and tx.Ext, the filter bits and distinct-value hashes the
// aggregation engine needs, so that nothing downstream keeps the record. Rejections name the user's field path
// (invalid:card.id). The tests hold it to goavro's reading of the same bytes.
//
// It is not the aggregation engine (pkg/feature) and knows nothing of windows
// beyond their specs, nor of Kafka, the wire-format prefix or the schema
// registry: Compiler gives the registry decoder one codec.Decoder per writer
// schema. Spec describes what the engine computes, field for field as
// pkg/feature's Spec.
package definition
