package check

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Paths from this package's directory (go test runs in it).
const (
	deployDir = ".."
	repoDir   = "../.."
)

// cli is what the dragon binary accepts, read from its Go source rather
// than by running it: building it needs cgo and llama.cpp (minutes), while
// parsing takes milliseconds and still catches a renamed or removed flag.
type cli struct {
	subcommands map[string]bool            // top-level: cloud, device, netsim, ...
	flags       map[string]map[string]bool // subcommand → its flags (true: boolean), global ones included
}

// flagSource is one place that defines flags: a function or method, with
// the prefix wire.Config.RegisterFlags is called with.
type flagSource struct {
	dir, recv, fn, prefix string
}

// flagSources says which functions define each subcommand's flags. It is
// explicit because the calls go through methods whose names repeat on other
// types (register), which syntax alone cannot resolve; a flag defined
// somewhere new then shows up as unknown here, a failure that is easy to
// fix rather than a check that silently weakens.
var flagSources = map[string][]flagSource{
	"": { // global (persistent) flags of the root command
		{dir: "cmd/dragon", fn: "run"},
	},
	"cloud": {
		{dir: "cmd/dragon", fn: "newCloudCmd"},
		{dir: "cmd/dragon", recv: "sideFlags", fn: "register"},
		{dir: "wire", recv: "Config", fn: "RegisterFlags", prefix: ""},
	},
	"device": {
		{dir: "cmd/dragon", fn: "newDeviceCmd"},
		{dir: "cmd/dragon", recv: "sideFlags", fn: "register"},
		{dir: "wire", recv: "Config", fn: "RegisterFlags", prefix: ""},
		{dir: "wire", recv: "Config", fn: "RegisterFlags", prefix: "cloud-"},
	},
	"netsim": {
		{dir: "cmd/dragon", fn: "newNetsimCmd"},
	},
}

// flagDef matches pflag's definition methods: String, StringVar, IntVarP,
// Var, ...; the Var forms take the name second, the others first.
var flagDef = regexp.MustCompile(`^(Bool|Int|Int8|Int16|Int32|Int64|Uint|Uint8|Uint16|Uint32|Uint64|Float32|Float64|String|Duration|StringSlice|StringArray|StringToString|IntSlice|BoolSlice|DurationSlice|Count|IP|IPNet|BytesHex)?(Var)?P?$`)

func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(repoDir, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, m, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", m, err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Skipf("no Go source in %s: deploy/check runs inside the dragon repository", filepath.Join(repoDir, dir))
	}
	return files
}

func recvName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	e := fd.Recv.List[0].Type
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

func findFunc(files []*ast.File, recv, name string) *ast.FuncDecl {
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == name && recvName(fd) == recv {
				return fd
			}
		}
	}
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

// flagNames lists the flags fd defines (true: boolean): name literals, or
// prefix+"name" where the function takes the link's prefix.
func flagNames(fd *ast.FuncDecl, prefix string) map[string]bool {
	names := map[string]bool{}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name == "P" || !flagDef.MatchString(sel.Sel.Name) {
			return true
		}
		isBool := strings.HasPrefix(sel.Sel.Name, "Bool")
		i := 0
		if strings.Contains(sel.Sel.Name, "Var") {
			i = 1
		}
		if len(call.Args) <= i {
			return true
		}
		switch a := call.Args[i].(type) {
		case *ast.BasicLit:
			if s, ok := stringLit(a); ok {
				names[s] = isBool
			}
		case *ast.BinaryExpr:
			if s, ok := stringLit(a.Y); ok && a.Op == token.ADD {
				names[prefix+s] = isBool
			}
		}
		return true
	})
	return names
}

// subcommandNames reads the top-level subcommands: each file's init adds
// its constructor to `commands`, whose cobra.Command literal's Use starts
// with the name.
func subcommandNames(files []*ast.File) map[string]bool {
	var ctors []string
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != "init" || fd.Recv != nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if id, isID := call.Fun.(*ast.Ident); isID && id.Name == "append" && len(call.Args) == 2 {
					if c, ok := call.Args[0].(*ast.Ident); ok && c.Name == "commands" {
						if ctor, ok := call.Args[1].(*ast.Ident); ok {
							ctors = append(ctors, ctor.Name)
						}
					}
				}
				return true
			})
		}
	}
	subs := map[string]bool{}
	for _, c := range ctors {
		fd := findFunc(files, "", c)
		if fd == nil {
			continue
		}
		found := false
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			kv, ok := n.(*ast.KeyValueExpr)
			if found || !ok {
				return !found
			}
			if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Use" {
				if s, ok := stringLit(kv.Value); ok {
					if w := strings.Fields(s); len(w) > 0 {
						subs[w[0]] = true
						found = true
					}
				}
			}
			return true
		})
	}
	return subs
}

func loadCLI(t *testing.T) *cli {
	t.Helper()
	parsed := map[string][]*ast.File{}
	files := func(dir string) []*ast.File {
		if parsed[dir] == nil {
			parsed[dir] = parseDir(t, dir)
		}
		return parsed[dir]
	}
	c := &cli{subcommands: subcommandNames(files("cmd/dragon")), flags: map[string]map[string]bool{}}
	for _, want := range []string{"cloud", "device", "netsim"} {
		if !c.subcommands[want] {
			t.Fatalf("cmd/dragon defines no %q subcommand (found %v)", want, keys(c.subcommands))
		}
	}
	for sub, srcs := range flagSources {
		set := map[string]bool{"help": true}
		for _, s := range srcs {
			fd := findFunc(files(s.dir), s.recv, s.fn)
			if fd == nil {
				t.Fatalf("flag source %s.%s not found in %s: update flagSources", s.recv, s.fn, s.dir)
			}
			for n, isBool := range flagNames(fd, s.prefix) {
				set[n] = isBool
			}
		}
		c.flags[sub] = set
	}
	for sub, set := range c.flags {
		if sub == "" {
			continue
		}
		for g, isBool := range c.flags[""] {
			set[g] = isBool
		}
	}
	// Guards against the extraction finding nothing and every check passing.
	for sub, want := range map[string][]string{
		"":       {"config", "verbose"},
		"cloud":  {"listen", "http", "token", "tls-cert", "max-sessions", "drain-timeout"},
		"device": {"listen", "cloud", "cloud-token", "cloud-tls-ca", "cloud-insecure"},
		"netsim": {"listen", "upstream", "latency", "jitter"},
	} {
		for _, f := range want {
			if _, ok := c.flags[sub][f]; !ok {
				t.Fatalf("flag extraction lost --%s of %q (found %v): update flagSources", f, sub, keys(c.flags[sub]))
			}
		}
	}
	return c
}

// checkArgs checks a dragon command line (without the program name): a
// real subcommand first, then only flags it defines. It returns the
// subcommand and the flags' values (last one wins, as with pflag).
func (c *cli) checkArgs(t *testing.T, where string, args []string) (string, map[string]string) {
	t.Helper()
	vals := map[string]string{}
	if len(args) == 0 {
		t.Errorf("%s: no dragon subcommand", where)
		return "", vals
	}
	sub := args[0]
	if !c.subcommands[sub] {
		t.Errorf("%s: %q is not a dragon subcommand (have %v)", where, sub, keys(c.subcommands))
		return sub, vals
	}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			continue // a value, or a positional argument
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		isBool, ok := c.flags[sub][name]
		if !ok {
			t.Errorf("%s: dragon %s has no flag --%s", where, sub, name)
			continue
		}
		if !hasVal {
			if !isBool && i+1 < len(args) {
				val = args[i+1]
				i++
			} else {
				val = "true"
			}
		}
		vals[name] = val
	}
	return sub, vals
}

// port is the port of a host:port address, or "" if it has none.
func port(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return p
}

func host(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return h
}

func TestCLIExtraction(t *testing.T) {
	c := loadCLI(t)
	t.Logf("subcommands: %v", keys(c.subcommands))
	for _, sub := range []string{"cloud", "device", "netsim"} {
		t.Logf("%s: %d flags", sub, len(c.flags[sub]))
	}
}
