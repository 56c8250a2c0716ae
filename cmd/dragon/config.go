package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// Every flag of every command can also come from the environment or a
// config file; the command line wins, then the environment, then the file.
//
//   - Environment: DRAGON_<COMMAND>_<FLAG>, upper case, dashes and spaces
//     as underscores: DRAGON_DEVICE_CLOUD_TIMEOUT=5s, DRAGON_BENCH_AGG_RUNS=3.
//   - File (--config FILE, YAML): a map per command, then flag names:
//
//     device:
//     cloud: cloud.example.net:7070
//     cloud-timeout: 5s
//     cloud:
//     threads: 4
//
// An unknown command or flag in the file, or a value a flag refuses, is an
// error that names it.

// configEnv is the environment variable of flag f of command path.
func configEnv(path, flag string) string {
	r := strings.NewReplacer("-", "_", " ", "_")
	return "DRAGON_" + strings.ToUpper(r.Replace(path)+"_"+r.Replace(flag))
}

// commandKey is a command's name in the config file and the environment:
// its path without the program name ("device", "bench agg").
func commandKey(cmd *cobra.Command) string {
	path := cmd.CommandPath()
	if i := strings.IndexByte(path, ' '); i >= 0 {
		return path[i+1:]
	}
	return path
}

// applyConfig sets cmd's flags not given on the command line from the
// environment, then from the file (empty: none).
func applyConfig(cmd *cobra.Command, file string) error {
	key := commandKey(cmd)
	var fromFile map[string]yaml.Node
	if file != "" {
		all, err := readConfig(file)
		if err != nil {
			return err
		}
		node, ok := all[key]
		if ok {
			if err := node.Decode(&fromFile); err != nil {
				return fmt.Errorf("--config %s: %s: want a map of flag names to values: %w", file, key, err)
			}
		}
		for name := range fromFile {
			if cmd.Flags().Lookup(name) == nil {
				return fmt.Errorf("--config %s: %s: unknown flag %q (dragon %s --help lists them)", file, key, name, key)
			}
		}
	}
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "config" || f.Name == "help" {
			return
		}
		env := configEnv(key, f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if err := setFlag(cmd, f, v); err != nil {
				errs = append(errs, fmt.Errorf("$%s: %w", env, err))
			}
			return
		}
		if n, ok := fromFile[f.Name]; ok {
			if err := setNode(cmd, f, n); err != nil {
				errs = append(errs, fmt.Errorf("--config %s: %s.%s: %w", file, key, f.Name, err))
			}
		}
	})
	return errors.Join(errs...)
}

// readConfig parses the file and checks its commands exist.
func readConfig(file string) (map[string]yaml.Node, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var all map[string]yaml.Node
	if err := yaml.Unmarshal(b, &all); err != nil {
		return nil, fmt.Errorf("--config %s: %w", file, err)
	}
	return all, nil
}

func setFlag(cmd *cobra.Command, f *pflag.Flag, v string) error {
	if err := cmd.Flags().Set(f.Name, v); err != nil {
		return fmt.Errorf("--%s: %w", f.Name, err)
	}
	return nil
}

// setNode sets a flag from a YAML scalar, or from a list for repeatable
// flags.
func setNode(cmd *cobra.Command, f *pflag.Flag, n yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		return setFlag(cmd, f, n.Value)
	case yaml.SequenceNode:
		for _, item := range n.Content {
			if item.Kind != yaml.ScalarNode {
				return fmt.Errorf("--%s: list items must be scalars", f.Name)
			}
			if err := setFlag(cmd, f, item.Value); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("--%s: want a value or a list", f.Name)
}

// checkConfigCommands reports commands in the file that dragon lacks.
func checkConfigCommands(root *cobra.Command, file string) error {
	if file == "" {
		return nil
	}
	all, err := readConfig(file)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		known[commandKey(c)] = true
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	var unknown []string
	for k := range all {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		return fmt.Errorf("--config %s: unknown commands %s", file, strings.Join(unknown, ", "))
	}
	return nil
}
