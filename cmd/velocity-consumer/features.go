package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// featureSet is --features: a feature definition, read and checked at start.
// Every writer schema the input may name is compiled by compile; the
// definition's own schema file (or --writer-schema) is compiled at start, so a
// path the schema lacks stops the command before it reads a record.
type featureSet struct {
	spec    *feature.Spec
	schema  string // the output record's Avro schema (feature.AvroSchema)
	version string // the velocity.definition header: "<label>@<hash>" or "@<hash>"
	compile func(writerSchema string) (codec.Decoder, error)
	// groups are the definition's re-keyed groups (docs/repartition.md), in the
	// order the decoder fills codec.Transaction.Groups.
	groups []rekeyedGroup
	// group is the in-place group's name (the definition's `group`).
	group string
}

// inPlaceGroup is the in-place group's name for the query API ("" without a
// definition).
func (fs *featureSet) inPlaceGroup() string {
	if fs == nil {
		return ""
	}
	return fs.group
}

// rekeyedGroup is one re-keyed group of a definition.
type rekeyedGroup struct {
	name   string
	spec   *feature.Spec
	schema string // its output record's Avro schema
}

// groupTopicTemplate is --group-topic's default: a re-keyed group's features go
// to the output topic's name, a dot and the group's name.
const groupTopicTemplate = "{output}.{group}"

// groupTopic names group's output topic from --group-topic's template.
func groupTopic(template, output, group string) (string, error) {
	if !strings.Contains(template, "{group}") {
		return "", fmt.Errorf("--group-topic (VELOCITY_GROUP_TOPIC) %q must contain {group}: every re-keyed group needs a topic of its own", template)
	}
	return strings.NewReplacer("{output}", output, "{group}", group).Replace(template), nil
}

// repartitionTopic is the repartition topic of a re-keyed group of a consumer
// group's deployment.
func repartitionTopic(consumerGroup, group string) string {
	return sink.RepartitionTopicPrefix + consumerGroup + "-" + group
}

// hops is the first stage's view of the groups of a deployment.
func (fs *featureSet) hops(consumerGroup string) []pipeline.HopGroup {
	if fs == nil {
		return nil
	}
	var hs []pipeline.HopGroup
	for _, g := range fs.groups {
		hs = append(hs, pipeline.HopGroup{Name: g.name, Topic: repartitionTopic(consumerGroup, g.name), Words: g.spec.Words()})
	}
	return hs
}

// loadFeatures reads and checks --features. writerSchema is --writer-schema's
// text ("" when not given); it returns the schema the input is read with when no
// registry names one per record: that one, else the definition's input.schema,
// else "" (ours).
func loadFeatures(path, writerSchema string, limits codec.Limits) (*featureSet, string, error) {
	def, err := definition.LoadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("--features (VELOCITY_FEATURES): %w", err)
	}
	fs := &featureSet{compile: definition.Compiler(def, limits)}
	if file := def.SchemaFile(); file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, "", fmt.Errorf("--features %s: input.schema: %w", path, err)
		}
		if writerSchema != "" && writerSchema != string(b) {
			return nil, "", fmt.Errorf("--features %s names the input schema %s and --writer-schema names another: give one", path, file)
		}
		writerSchema = string(b)
	}
	// A named schema is compiled now, so that a path it lacks stops the command
	// here. With none, the schema is the registry's per record, or ours: the caller
	// compiles ours when it reads without a registry.
	if writerSchema != "" {
		if _, err := fs.decoder(writerSchema); err != nil {
			return nil, "", fmt.Errorf("--features %s: %w", path, err)
		}
	}
	specs, err := definition.EngineSpecs(def)
	if err != nil {
		return nil, "", fmt.Errorf("--features %s: %w", path, err)
	}
	fs.spec, fs.group = specs[0].Spec, specs[0].Name
	fs.schema = feature.AvroSchema(fs.spec)
	for _, g := range specs[1:] {
		fs.groups = append(fs.groups, rekeyedGroup{name: g.Name, spec: g.Spec, schema: feature.AvroSchema(g.Spec)})
	}
	fs.version = def.Version + "@" + def.Hash()
	return fs, writerSchema, nil
}

// engineSpec is the features the pipeline computes: nil without --features.
func (fs *featureSet) engineSpec() *feature.Spec {
	if fs == nil {
		return nil
	}
	return fs.spec
}

// decoder compiles the definition over one writer schema ("" is ours).
func (fs *featureSet) decoder(writerSchema string) (codec.Decoder, error) {
	if writerSchema == "" {
		writerSchema = schemas.Transaction
	}
	return fs.compile(writerSchema)
}

var errFeaturesWindows = errors.New("--windows and --features exclude each other: a feature definition names its own windows")
