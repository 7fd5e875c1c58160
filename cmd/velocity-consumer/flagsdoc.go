package main

import (
	"flag"
	"fmt"
	"strings"
)

// docs/flags.md is generated from the flag definitions below, so that it
// cannot say something --help does not. After adding or changing a flag:
//
//	go generate ./cmd/velocity-consumer
//
// TestFlagReference fails while the file differs from what this renders, and
// checks it against what each command's --help prints.
//go:generate go test -run ^TestFlagReference$ . -update-flag-reference

// flagCommands are the commands whose flags docs/flags.md lists, each with
// its usage text and the registration the command itself uses.
var flagCommands = []struct {
	name, usage string
	register    func(*envFlags)
}{
	{"run", runUsage, func(e *envFlags) { var r runFlags; r.register(e) }},
	{"replay", replayUsage, func(e *envFlags) { var r replayFlags; r.register(e) }},
	{"demo", demoUsage, func(e *envFlags) { var d demoFlags; d.register(e) }},
	{"produce", produceUsage, func(e *envFlags) { var p produceFlags; p.register(e) }},
}

// flagReference renders docs/flags.md.
func flagReference() string {
	var b strings.Builder
	b.WriteString(`# Flag reference

<!-- Generated from the flag definitions in cmd/velocity-consumer by
     'go generate ./cmd/velocity-consumer'. Do not edit by hand. -->

Every flag can also be given as an environment variable, shown beside it; a
flag on the command line wins over the variable, which wins over the default.
Durations are Go durations (` + "`500ms`, `2s`, `5m`, `24h`" + `). Two secrets
are read only from a file flag or the environment, never from a flag, so they
do not show in ` + "`ps`" + ` or shell history: ` + "`VELOCITY_SASL_PASSWORD`" + ` (or
` + "`--sasl-password-file`" + `) and ` + "`VELOCITY_SCHEMA_REGISTRY_PASSWORD`" + ` (or
` + "`--schema-registry-password-file`" + `).

Commands: `)
	for i, c := range flagCommands {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[`%s`](#%s)", c.name, c.name)
	}
	b.WriteString(". `velocity-consumer version` (or `--version`) takes no flags.\n")
	for _, c := range flagCommands {
		e := newEnvFlags(c.name, c.usage)
		c.register(e)
		title, _, _ := strings.Cut(c.usage, "\n")
		fmt.Fprintf(&b, "\n## %s\n\n`velocity-consumer %s`: %s\n\n", c.name, c.name, strings.TrimPrefix(title, "velocity-consumer "+c.name+": "))
		b.WriteString("| flag | environment | default | meaning |\n| --- | --- | --- | --- |\n")
		e.fs.VisitAll(func(f *flag.Flag) {
			typ, help := flag.UnquoteUsage(f)
			name := "`--" + f.Name + "`"
			if typ != "" {
				name += " " + typ
			}
			def := ""
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
				def = "`" + f.DefValue + "`"
			}
			fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", name, e.env[f.Name], def, cell(help))
		})
	}
	return b.String()
}

// cell makes help text one Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}
