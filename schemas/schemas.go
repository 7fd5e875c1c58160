// Package schemas holds the Avro schemas of velocity-consumer's data contract:
// the input Transaction and the output VelocityFeatures, namespace io.velocity.v1.
//
// The .avsc files beside this file are the source of truth; they are embedded
// so that the binary, the tests and a schema registry all see the same bytes.
// This package is for the schema text only: encoding, decoding and validation
// live in pkg/codec.
package schemas

import _ "embed"

// Transaction is the reader schema of the input topic (record io.velocity.v1.Transaction).
//
//go:embed transaction.avsc
var Transaction string

// VelocityFeatures is the writer schema of the features topic
// (record io.velocity.v1.VelocityFeatures).
//
//go:embed velocity_features.avsc
var VelocityFeatures string
