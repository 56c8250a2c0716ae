package check

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// composeFile is the subset of the Compose specification deploy/docker
// uses. Decoding is strict: a field outside it (a typo, or a feature the
// checks below know nothing of) fails the test until it is added here.
type composeFile struct {
	Name     string                    `json:"name"`
	Services map[string]composeService `json:"services"`
}

type composeService struct {
	Build           *composeBuild            `json:"build,omitempty"`
	Image           string                   `json:"image,omitempty"`
	Command         []string                 `json:"command,omitempty"`
	Environment     map[string]string        `json:"environment,omitempty"`
	Volumes         []string                 `json:"volumes,omitempty"`
	Ports           []string                 `json:"ports,omitempty"`
	Healthcheck     *composeHealthcheck      `json:"healthcheck,omitempty"`
	DependsOn       map[string]composeDepend `json:"depends_on,omitempty"`
	StopGracePeriod string                   `json:"stop_grace_period,omitempty"`
	Restart         string                   `json:"restart,omitempty"`
}

type composeBuild struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile"`
	Target     string `json:"target"`
}

type composeHealthcheck struct {
	Test        []string `json:"test"`
	Interval    string   `json:"interval"`
	Timeout     string   `json:"timeout"`
	Retries     int      `json:"retries"`
	StartPeriod string   `json:"start_period"`
}

type composeDepend struct {
	Condition string `json:"condition"`
}

// interpolation is a compose variable reference: ${VAR}, ${VAR:-default},
// ${VAR:?error}.
var interpolation = regexp.MustCompile(`^\$\{[A-Z_][A-Z0-9_]*(:?[-?][^}]*)?\}$`)

func keys[K comparable, V any](m map[K]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, fmt.Sprint(k))
	}
	sort.Strings(out)
	return out
}

// dockerStage is one stage of a Dockerfile, with what it inherits from the
// stage it is built FROM.
type dockerStage struct {
	name, from   string
	expose       []string
	user         string
	healthcheck  []string // the CMD of HEALTHCHECK
	cmd          []string
	entrypoint   []string
	instructions []string // every instruction, continuation lines joined
}

// parseDockerfile reads the instructions of each stage (enough for the
// checks here, not a full Dockerfile parser: exec-form CMD, ENTRYPOINT and
// HEALTHCHECK CMD are JSON arrays).
func parseDockerfile(t *testing.T, file string) map[string]*dockerStage {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(l)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		lines = append(lines, cur+trimmed)
		cur = ""
	}
	stages := map[string]*dockerStage{}
	var st *dockerStage
	jsonArray := func(s string) []string {
		var a []string
		if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &a); err != nil {
			t.Errorf("%s: %q: want the exec (JSON array) form: %v", file, s, err)
		}
		return a
	}
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		instr = strings.ToUpper(instr)
		if instr == "FROM" {
			f := strings.Fields(rest)
			st = &dockerStage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				default:
					st.from = f[i]
				}
			}
			if base, ok := stages[st.from]; ok { // inherit from an earlier stage
				st.expose = slices.Clone(base.expose)
				st.user, st.healthcheck, st.cmd, st.entrypoint = base.user, base.healthcheck, base.cmd, base.entrypoint
			}
			stages[st.name] = st
			continue
		}
		if st == nil {
			continue // ARG before the first FROM
		}
		st.instructions = append(st.instructions, l)
		switch instr {
		case "EXPOSE":
			st.expose = append(st.expose, strings.Fields(rest)...)
		case "USER":
			st.user = strings.TrimSpace(rest)
		case "CMD":
			st.cmd = jsonArray(rest)
		case "ENTRYPOINT":
			st.entrypoint = jsonArray(rest)
		case "HEALTHCHECK":
			_, c, ok := strings.Cut(rest, "CMD ")
			if !ok {
				t.Errorf("%s: HEALTHCHECK without CMD", file)
				continue
			}
			st.healthcheck = jsonArray(c)
		}
	}
	return stages
}

func TestDockerfile(t *testing.T) {
	c := loadCLI(t)
	file := filepath.Join(deployDir, "docker", "Dockerfile")
	stages := parseDockerfile(t, file)
	for _, target := range []string{"cloud", "device"} {
		t.Run(target, func(t *testing.T) {
			st := stages[target]
			if st == nil {
				t.Fatalf("no stage %q (have %v)", target, keys(stages))
			}
			if st.user == "" || st.user == "root" || strings.HasPrefix(st.user, "0") {
				t.Errorf("USER %q: the daemons run as a non-root user", st.user)
			}
			if !slices.Equal(st.entrypoint, []string{"dragon"}) {
				t.Errorf("ENTRYPOINT %v: want [dragon], so that CMD, compose's command and Kubernetes' args start with the subcommand", st.entrypoint)
			}
			sub, vals := c.checkArgs(t, "CMD", st.cmd)
			if sub != target {
				t.Errorf("stage %s runs dragon %s", target, sub)
			}
			served := []string{port(vals["listen"]), port(vals["http"])}
			if !slices.Equal(sortedCopy(st.expose), sortedCopy(served)) {
				t.Errorf("EXPOSE %v, but CMD serves on %v", st.expose, served)
			}
			if len(st.healthcheck) < 3 || st.healthcheck[0] != "dragon-healthcheck" || !slices.Contains(served, st.healthcheck[2]) {
				t.Errorf("HEALTHCHECK %v: want dragon-healthcheck on a port CMD serves (%v)", st.healthcheck, served)
			}
		})
	}
	t.Run("no weights in the image", func(t *testing.T) {
		for name, st := range stages {
			for _, in := range st.instructions {
				f := strings.Fields(in)
				if len(f) > 1 && (strings.EqualFold(f[0], "COPY") || strings.EqualFold(f[0], "ADD")) {
					for _, src := range f[1 : len(f)-1] {
						if strings.HasPrefix(src, "models") || strings.HasPrefix(src, "data") || strings.HasSuffix(src, ".gguf") {
							t.Errorf("stage %s: %s copies model or index files into the image", name, in)
						}
					}
				}
			}
		}
		// COPY . . in the build stage: the ignore file keeps weights,
		// indexes and build outputs out of the context.
		b, err := os.ReadFile(file + ".dockerignore")
		if err != nil {
			t.Fatalf("%v (BuildKit reads it next to the Dockerfile)", err)
		}
		ignored := strings.Fields(string(b))
		for _, want := range []string{"models/", "data/", "bin/", "build/", ".git"} {
			if !slices.Contains(ignored, want) {
				t.Errorf("%s.dockerignore does not exclude %s", file, want)
			}
		}
	})
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return c
}

func TestCompose(t *testing.T) {
	c := loadCLI(t)
	file := filepath.Join(deployDir, "docker", "compose.yaml")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.UnmarshalStrict(b, &cf); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(cf.Services) == 0 {
		t.Fatal("no services")
	}
	for _, want := range []string{"cloud", "netsim", "device"} {
		if _, ok := cf.Services[want]; !ok {
			t.Errorf("no %s service", want)
		}
	}

	// What each service runs and serves, for the cross-references below.
	type served struct {
		sub   string
		vals  map[string]string
		ports map[string]bool // ports the command listens on
	}
	run := map[string]served{}
	for name, s := range cf.Services {
		sub, vals := c.checkArgs(t, "service "+name+" command", s.Command)
		ports := map[string]bool{}
		for _, f := range []string{"listen", "http", "control"} {
			if p := port(vals[f]); p != "" {
				ports[p] = true
			}
		}
		run[name] = served{sub, vals, ports}
	}

	for _, name := range keys(cf.Services) {
		s := cf.Services[name]
		sv := run[name]
		t.Run(name, func(t *testing.T) {
			if s.Build == nil && s.Image == "" {
				t.Error("neither build nor image")
			}
			if bd := s.Build; bd != nil {
				ctx := filepath.Join(deployDir, "docker", bd.Context)
				if _, err := os.Stat(filepath.Join(ctx, "go.mod")); err != nil {
					t.Errorf("build.context %s is not the repository root: %v", bd.Context, err)
				}
				df := filepath.Join(ctx, bd.Dockerfile)
				if _, err := os.Stat(df); err != nil {
					t.Errorf("build.dockerfile: %v", err)
				} else if _, ok := parseDockerfile(t, df)[bd.Target]; !ok {
					t.Errorf("build.target %q is not a stage of %s", bd.Target, bd.Dockerfile)
				}
			}
			// Plaintext is for the compose network; the host sees the
			// ports on its loopback only.
			for _, p := range s.Ports {
				f := strings.Split(p, ":")
				if len(f) != 3 {
					t.Errorf("port %q: want HOST_IP:HOST_PORT:CONTAINER_PORT", p)
					continue
				}
				if sv.vals["insecure"] == "true" && f[0] != "127.0.0.1" {
					t.Errorf("port %q: a plaintext (--insecure) service publishes on 127.0.0.1 only", p)
				}
				if !sv.ports[f[2]] {
					t.Errorf("port %q: the command serves nothing on %s (it serves %v)", p, f[2], keys(sv.ports))
				}
			}
			if hc := s.Healthcheck; hc != nil {
				if len(hc.Test) == 0 || !slices.Contains([]string{"CMD", "CMD-SHELL", "NONE"}, hc.Test[0]) {
					t.Errorf("healthcheck.test %v: want CMD, CMD-SHELL or NONE first", hc.Test)
				} else if len(hc.Test) > 3 && hc.Test[1] == "dragon-healthcheck" && !sv.ports[hc.Test[3]] {
					t.Errorf("healthcheck %v: the command serves nothing on port %s", hc.Test, hc.Test[3])
				}
				for what, d := range map[string]string{"interval": hc.Interval, "timeout": hc.Timeout, "start_period": hc.StartPeriod} {
					if _, err := time.ParseDuration(d); d != "" && err != nil {
						t.Errorf("healthcheck.%s %q: %v", what, d, err)
					}
				}
			} else if sv.sub == "cloud" || sv.sub == "device" {
				t.Error("no healthcheck")
			}
			for dep, cond := range s.DependsOn {
				ds, ok := cf.Services[dep]
				switch {
				case !ok:
					t.Errorf("depends_on %s: no such service", dep)
				case !slices.Contains([]string{"service_started", "service_healthy", "service_completed_successfully"}, cond.Condition):
					t.Errorf("depends_on %s: condition %q", dep, cond.Condition)
				case cond.Condition == "service_healthy" && ds.Healthcheck == nil:
					t.Errorf("depends_on %s: service_healthy, but %s has no healthcheck", dep, dep)
				}
			}
			for k, v := range s.Environment {
				if strings.Contains(k, "TOKEN") && v != "" && !interpolation.MatchString(v) {
					t.Errorf("environment %s: a literal token; take it from the host (${VAR})", k)
				}
			}
			for _, a := range s.Command {
				if strings.HasPrefix(a, "--token") || strings.HasPrefix(a, "--cloud-token") {
					t.Errorf("command: a token on the command line shows in ps; use the environment")
				}
			}
			for _, v := range s.Volumes {
				f := strings.Split(v, ":")
				if len(f) >= 2 && (strings.Contains(f[0], "models") || strings.Contains(f[0], "data")) && (len(f) < 3 || !strings.Contains(f[2], "ro")) {
					t.Errorf("volume %q: mount weights and indexes read-only (:ro)", v)
				}
			}
			// SIGTERM drains for --drain-timeout (30 s by default); compose
			// kills after stop_grace_period (10 s by default).
			if sv.sub == "cloud" || sv.sub == "device" {
				drain := 30 * time.Second
				if v := sv.vals["drain-timeout"]; v != "" {
					drain, _ = time.ParseDuration(v)
				}
				grace := 10 * time.Second
				if s.StopGracePeriod != "" {
					var err error
					if grace, err = time.ParseDuration(s.StopGracePeriod); err != nil {
						t.Errorf("stop_grace_period: %v", err)
					}
				}
				if grace <= drain {
					t.Errorf("stop_grace_period %v does not exceed --drain-timeout %v", grace, drain)
				}
			}
			// Addresses that name another service must hit a port it serves.
			for _, f := range []string{"upstream", "cloud"} {
				addr := sv.vals[f]
				if addr == "" || sv.sub == "cloud" {
					continue
				}
				target, ok := run[host(addr)]
				switch {
				case !ok:
					t.Errorf("--%s %s: no service %q", f, addr, host(addr))
				case !target.ports[port(addr)]:
					t.Errorf("--%s %s: service %s serves %v", f, addr, host(addr), keys(target.ports))
				}
				if _, dep := s.DependsOn[host(addr)]; ok && !dep {
					t.Errorf("--%s %s: depends_on should name %s, so that it starts first", f, addr, host(addr))
				}
			}
		})
	}

	// The device reaches the cloud through netsim, not directly: the link
	// is what is emulated.
	dev, ns := run["device"], run["netsim"]
	if host(dev.vals["cloud"]) != "netsim" {
		t.Errorf("device --cloud %s: want the netsim service", dev.vals["cloud"])
	}
	if host(ns.vals["upstream"]) != "cloud" {
		t.Errorf("netsim --upstream %s: want the cloud service", ns.vals["upstream"])
	}
	if ns.vals["latency"] == "" {
		t.Error("netsim without --latency emulates no link")
	}
	// The two ends share the cloud's token.
	if cf.Services["cloud"].Environment["DRAGON_TOKEN"] == "" || cf.Services["cloud"].Environment["DRAGON_TOKEN"] != cf.Services["device"].Environment["DRAGON_CLOUD_TOKEN"] {
		t.Error("the cloud's DRAGON_TOKEN and the device's DRAGON_CLOUD_TOKEN should come from the same variable")
	}
}
