package main

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

var updateFlagReference = flag.Bool("update-flag-reference", false, "rewrite docs/flags.md from the flag definitions")

const flagReferencePath = "../../docs/flags.md"

// TestFlagReference keeps docs/flags.md what the flag definitions say, and
// what each command's --help prints: every flag --help lists is in the
// command's section with its variable, and the section lists no other.
func TestFlagReference(t *testing.T) {
	want := flagReference()
	if *updateFlagReference {
		if err := os.WriteFile(flagReferencePath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(flagReferencePath)
	if err != nil {
		t.Fatalf("%v: generate it with 'go generate ./cmd/velocity-consumer'", err)
	}
	if string(got) != want {
		t.Fatalf("docs/flags.md is out of date with the flag definitions in cmd/velocity-consumer.\n" +
			"Regenerate it with 'go generate ./cmd/velocity-consumer' (or 'make docs') and commit it.")
	}

	helpFlag := regexp.MustCompile(`(?m)^  --([a-z0-9-]+).*\n(?:        .*\n)*?        env (VELOCITY_[A-Z0-9_]+)$`)
	docFlag := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)`[^|]*\\| `(VELOCITY_[A-Z0-9_]+)`")
	sections := strings.Split(string(got), "\n## ")[1:]
	if len(sections) != len(flagCommands) {
		t.Fatalf("%d command sections in docs/flags.md, want %d", len(sections), len(flagCommands))
	}
	for i, c := range flagCommands {
		t.Run(c.name, func(t *testing.T) {
			help, errOut, code := runBinary(t, c.name, "--help")
			if code != 0 || errOut != "" {
				t.Fatalf("%s --help: exit %d, stderr %q", c.name, code, errOut)
			}
			inHelp := map[string]string{}
			for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
				inHelp[m[1]] = m[2]
			}
			inDoc := map[string]string{}
			for _, m := range docFlag.FindAllStringSubmatch(sections[i], -1) {
				inDoc[m[1]] = m[2]
			}
			if len(inHelp) < 5 {
				t.Fatalf("read only %d flags from %s --help:\n%s", len(inHelp), c.name, help)
			}
			for name, env := range inHelp {
				if inDoc[name] != env {
					t.Errorf("%s --help lists --%s (%s); docs/flags.md has %q", c.name, name, env, inDoc[name])
				}
			}
			for name := range inDoc {
				if _, ok := inHelp[name]; !ok {
					t.Errorf("docs/flags.md lists %s --%s, which %s --help does not", c.name, name, c.name)
				}
			}
		})
	}
}
