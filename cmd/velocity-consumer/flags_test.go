package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/service"
)

func parseRun(t *testing.T, env map[string]string, args ...string) (*runFlags, error) {
	t.Helper()
	r, _, err := parseRunOutput(t, env, args...)
	return r, err
}

// parseRunOutput is parseRun that also returns what parsing printed.
func parseRunOutput(t *testing.T, env map[string]string, args ...string) (*runFlags, string, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var r runFlags
	e := newEnvFlags("run", runUsage)
	r.register(e)
	var out bytes.Buffer
	e.fs.SetOutput(&out)
	err := e.Parse(args)
	return &r, out.String(), err
}

func TestFlagPrecedence(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"default", nil, nil, "transactions"},
		{"environment", map[string]string{"VELOCITY_INPUT_TOPIC": "from-env"}, nil, "from-env"},
		{"flag beats environment", map[string]string{"VELOCITY_INPUT_TOPIC": "from-env"}, []string{"--input-topic", "from-flag"}, "from-flag"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseRun(t, tc.env, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if r.input != tc.want {
				t.Fatalf("input topic %q, want %q", r.input, tc.want)
			}
		})
	}
}

func TestValidationErrorsNameTheFlag(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string // substring of the error
	}{
		{"bad windows", nil, []string{"--windows", "5m:7s"}, "--windows"},
		{"negative lateness", nil, []string{"--allowed-lateness", "-1s"}, "--allowed-lateness"},
		{"late policy", nil, []string{"--late", "ignore"}, "--late"},
		{"empty brokers", nil, []string{"--brokers", " , "}, "--brokers"},
		{"output is input", nil, []string{"--output-topic", "transactions"}, "--input-topic"},
		{"store scheme", nil, []string{"--checkpoint-store", "s3://bucket"}, "--checkpoint-store"},
		{"store directory not creatable", nil, []string{"--checkpoint-store", "file:///proc/velocity-nope"}, "--checkpoint-store (VELOCITY_CHECKPOINT_STORE)"},
		{"ttl below window", nil, []string{"--entity-ttl", "1h"}, "--entity-ttl"},
		{"bad env value", map[string]string{"VELOCITY_CHECKPOINT_INTERVAL": "soon"}, nil, "VELOCITY_CHECKPOINT_INTERVAL"},
		{"writer schema missing", nil, []string{"--writer-schema", "/nonexistent.avsc"}, "--writer-schema"},
		{"stray argument", nil, []string{"extra"}, "unexpected argument"},
		{"no producers", nil, []string{"--producers", "0"}, "--producers"},
		{"too many producers", map[string]string{"VELOCITY_PRODUCERS": "65"}, nil, "VELOCITY_PRODUCERS"},
		{"no fetch bytes", nil, []string{"--fetch-min-bytes", "0"}, "--fetch-min-bytes"},
		{"fetch wait below franz-go's floor", nil, []string{"--fetch-max-wait", "5ms"}, "--fetch-max-wait"},
		{"fetch wait from env", map[string]string{"VELOCITY_FETCH_MAX_WAIT": "2m"}, nil, "VELOCITY_FETCH_MAX_WAIT"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseRun(t, tc.env, tc.args...)
			if err == nil {
				_, err = r.serviceConfig()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestCommandLineMistakes: a value that does not parse, an unknown flag or a
// missing value get one line naming the flag, its variable where it has one,
// and what a value must look like, not the flag package's whole usage text.
// --help still prints the usage.
func TestCommandLineMistakes(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string // substrings of the error
	}{
		{"duration", nil, []string{"--allowed-lateness", "abc"}, []string{"--allowed-lateness", "VELOCITY_ALLOWED_LATENESS", `"abc"`, "want a duration"}},
		{"boolean", nil, []string{"--exactly-once=maybe"}, []string{"--exactly-once", "VELOCITY_EXACTLY_ONCE", "want true or false"}},
		{"number", nil, []string{"--max-entities", "many"}, []string{"--max-entities", "VELOCITY_MAX_ENTITIES", "want a whole number"}},
		{"unknown flag", nil, []string{"--windowz", "1m:1s"}, []string{"unknown flag --windowz", "--help"}},
		{"missing value", nil, []string{"--group"}, []string{"--group needs a value"}},
		{"duration from the environment", map[string]string{"VELOCITY_IDLE_TIMEOUT": "soon"}, nil, []string{"VELOCITY_IDLE_TIMEOUT", "--idle-timeout", "want a duration"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, out, err := parseRunOutput(t, tc.env, tc.args...)
			if err == nil {
				t.Fatal("parsed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if out != "" {
				t.Errorf("printed %d bytes besides the error (the usage?):\n%.200s", len(out), out)
			}
		})
	}
	if _, out, err := parseRunOutput(t, nil, "--help"); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out, "VELOCITY_INPUT_TOPIC") {
		t.Errorf("--help: %v, printed %d bytes; want flag.ErrHelp and the usage", err, len(out))
	}
}

func TestValidConfig(t *testing.T) {
	r, err := parseRun(t, map[string]string{"VELOCITY_BROKERS": "a:9092,b:9092"},
		"--checkpoint-store", "file://"+t.TempDir(), "--allowed-lateness", "2s", "--late", "apply", "--windows", "10s:1s,1m:10s")
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.serviceConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Brokers) != 2 || c.Watermark.AllowedLateness != 2000 || c.Late.String() != "apply" || len(c.Specs) != 2 || c.CheckpointInterval != 5*time.Second || c.Producers != 1 ||
		c.FetchMinBytes != service.DefaultFetchMinBytes || c.FetchMaxWait != service.DefaultFetchMaxWait {
		t.Fatalf("config %+v", c)
	}
}

// TestHelpListsEveryEnvVar keeps --help true: every flag shows its variable.
func TestHelpListsEveryEnvVar(t *testing.T) {
	var r runFlags
	e := newEnvFlags("run", runUsage)
	r.register(e)
	var out bytes.Buffer
	e.fs.SetOutput(&out)
	e.fs.Usage()
	help := out.String()
	for name, env := range e.env {
		if !strings.Contains(help, "--"+name) || !strings.Contains(help, "env "+env) {
			t.Errorf("help lacks --%s / %s", name, env)
		}
	}
	if !strings.Contains(help, "never entity data") {
		t.Errorf("help should say the metrics carry no entity data")
	}
}

func TestUnknownCommand(t *testing.T) {
	if code := mainErr([]string{"frobnicate"}); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	if code := mainErr([]string{"run", "--help"}); code != 0 {
		t.Fatalf("--help exit code %d, want 0", code)
	}
}
