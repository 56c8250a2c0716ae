package check

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// kinds are the only objects deploy/k8s may hold, each decoded into its
// typed struct; anything else is an error, so a typo in apiVersion or kind
// cannot slip through as an unchecked map.
var kinds = map[schema.GroupVersionKind]func() any{
	corev1.SchemeGroupVersion.WithKind("Namespace"):             func() any { return &corev1.Namespace{} },
	corev1.SchemeGroupVersion.WithKind("ConfigMap"):             func() any { return &corev1.ConfigMap{} },
	corev1.SchemeGroupVersion.WithKind("Service"):               func() any { return &corev1.Service{} },
	corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"): func() any { return &corev1.PersistentVolumeClaim{} },
	appsv1.SchemeGroupVersion.WithKind("Deployment"):            func() any { return &appsv1.Deployment{} },
	appsv1.SchemeGroupVersion.WithKind("StatefulSet"):           func() any { return &appsv1.StatefulSet{} },
	policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"): func() any { return &policyv1.PodDisruptionBudget{} },
	monitoringv1.SchemeGroupVersion.WithKind("ServiceMonitor"):  func() any { return &monitoringv1.ServiceMonitor{} },
}

// builtinGroups are served by every API server; objects of other groups
// need a CRD installed first.
var builtinGroups = map[string]bool{"": true, "apps": true, "policy": true}

// manifests is what deploy/k8s holds, by kind.
type manifests struct {
	namespaces      []*corev1.Namespace
	configMaps      []*corev1.ConfigMap
	services        []*corev1.Service
	pvcs            []*corev1.PersistentVolumeClaim
	deployments     []*appsv1.Deployment
	statefulSets    []*appsv1.StatefulSet
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*monitoringv1.ServiceMonitor
	// crdOnly: files whose every object needs a CRD.
	crdOnly map[string]bool
}

// kustomization is the part of kustomize's Kustomization used here,
// decoded strictly like the rest.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

const kustomizationFile = "kustomization.yaml"

// splitYAML returns the documents of a multi-document YAML file, leaving
// out those with nothing but comments.
func splitYAML(b []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var probe map[string]any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			return nil, err
		}
		if len(probe) > 0 {
			docs = append(docs, doc)
		}
	}
}

// decode strictly decodes one document into the typed struct of its kind:
// YAML becomes JSON, which encoding/json decodes with unknown and duplicate
// fields refused.
func decode(doc []byte) (any, schema.GroupVersionKind, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, schema.GroupVersionKind{}, err
	}
	gvk := tm.GroupVersionKind()
	newObj, ok := kinds[gvk]
	if !ok {
		return nil, gvk, fmt.Errorf("unexpected kind %q apiVersion %q (deploy/check knows %v)", tm.Kind, tm.APIVersion, keys(kinds))
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, gvk, err
	}
	return obj, gvk, nil
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	dir := filepath.Join(deployDir, "k8s")
	files, err := filepath.Glob(filepath.Join(dir, "*.y*ml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no manifests in %s", dir)
	}
	m := &manifests{crdOnly: map[string]bool{}}
	for _, f := range files {
		base := filepath.Base(f)
		if base == kustomizationFile {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := splitYAML(b)
		if err != nil {
			t.Errorf("%s: %v", base, err)
			continue
		}
		if len(docs) == 0 {
			t.Errorf("%s: no object", base)
		}
		crdOnly := len(docs) > 0
		for i, doc := range docs {
			obj, gvk, err := decode(doc)
			if err != nil {
				t.Errorf("%s, document %d: %v", base, i+1, err)
				continue
			}
			crdOnly = crdOnly && !builtinGroups[gvk.Group]
			switch o := obj.(type) {
			case *corev1.Namespace:
				m.namespaces = append(m.namespaces, o)
			case *corev1.ConfigMap:
				m.configMaps = append(m.configMaps, o)
			case *corev1.Service:
				m.services = append(m.services, o)
			case *corev1.PersistentVolumeClaim:
				m.pvcs = append(m.pvcs, o)
			case *appsv1.Deployment:
				m.deployments = append(m.deployments, o)
			case *appsv1.StatefulSet:
				m.statefulSets = append(m.statefulSets, o)
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
			case *monitoringv1.ServiceMonitor:
				m.serviceMonitors = append(m.serviceMonitors, o)
			}
		}
		m.crdOnly[base] = crdOnly
	}
	return m
}

// objectMetas is every object's metadata, for the checks common to all.
func (m *manifests) objectMetas() map[string]*metav1.ObjectMeta {
	out := map[string]*metav1.ObjectMeta{}
	add := func(kind string, om *metav1.ObjectMeta) { out[kind+"/"+om.Name] = om }
	for _, o := range m.namespaces {
		add("Namespace", &o.ObjectMeta)
	}
	for _, o := range m.configMaps {
		add("ConfigMap", &o.ObjectMeta)
	}
	for _, o := range m.services {
		add("Service", &o.ObjectMeta)
	}
	for _, o := range m.pvcs {
		add("PersistentVolumeClaim", &o.ObjectMeta)
	}
	for _, o := range m.deployments {
		add("Deployment", &o.ObjectMeta)
	}
	for _, o := range m.statefulSets {
		add("StatefulSet", &o.ObjectMeta)
	}
	for _, o := range m.pdbs {
		add("PodDisruptionBudget", &o.ObjectMeta)
	}
	for _, o := range m.serviceMonitors {
		add("ServiceMonitor", &o.ObjectMeta)
	}
	return out
}

func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t)
	c := loadCLI(t)

	t.Run("metadata", func(t *testing.T) {
		declared := map[string]bool{}
		for _, ns := range m.namespaces {
			declared[ns.Name] = true
		}
		for id, om := range m.objectMetas() {
			for _, msg := range validation.IsDNS1123Subdomain(om.Name) {
				t.Errorf("%s: name: %s", id, msg)
			}
			for _, e := range metavalidation.ValidateLabels(om.Labels, field.NewPath(id, "metadata", "labels")) {
				t.Errorf("%v", e)
			}
			if strings.HasPrefix(id, "Namespace/") {
				continue
			}
			if !declared[om.Namespace] {
				t.Errorf("%s: namespace %q is not among the Namespaces of deploy/k8s %v", id, om.Namespace, keys(declared))
			}
		}
	})

	if len(m.deployments) == 0 {
		t.Fatal("no Deployment in deploy/k8s")
	}
	for _, d := range m.deployments {
		t.Run("Deployment/"+d.Name, func(t *testing.T) { checkDeployment(t, m, c, d) })
	}
	for _, ss := range m.statefulSets {
		t.Run("StatefulSet/"+ss.Name, func(t *testing.T) { checkStatefulSet(t, m, ss) })
	}

	t.Run("Services", func(t *testing.T) {
		headless := 0
		for _, s := range m.services {
			id := "Service/" + s.Name
			if len(s.Spec.Selector) == 0 {
				t.Errorf("%s: no selector", id)
				continue
			}
			pods := m.podsSelectedBy(s.Namespace, labels.SelectorFromSet(s.Spec.Selector))
			if len(pods) == 0 {
				t.Errorf("%s: selector %v selects no Deployment's or StatefulSet's pods", id, s.Spec.Selector)
			}
			if s.Spec.ClusterIP == corev1.ClusterIPNone {
				headless++
				if s.Spec.Type != "" && s.Spec.Type != corev1.ServiceTypeClusterIP {
					t.Errorf("%s: headless, so type must be ClusterIP, not %s", id, s.Spec.Type)
				}
			}
			if len(s.Spec.Ports) == 0 {
				t.Errorf("%s: no ports", id)
			}
			for _, p := range s.Spec.Ports {
				if len(s.Spec.Ports) > 1 && p.Name == "" {
					t.Errorf("%s: port %d: a Service with several ports must name each", id, p.Port)
				}
				for _, msg := range validation.IsValidPortName(p.Name) {
					if p.Name != "" {
						t.Errorf("%s: port name %q: %s", id, p.Name, msg)
					}
				}
				target := p.TargetPort
				if target.Type == intstr.Int && target.IntVal == 0 {
					target = intstr.FromInt32(p.Port) // the default
				}
				for _, pod := range pods {
					if _, ok := resolvePort(pod.containers, target); !ok {
						t.Errorf("%s: port %s targets %s, which no container of %s exposes", id, p.Name, target.String(), pod.owner)
					}
				}
			}
		}
		if headless == 0 {
			t.Error("no headless Service (clusterIP: None) for gRPC client-side load balancing")
		}
	})

	t.Run("PodDisruptionBudgets", func(t *testing.T) {
		for _, d := range m.workloads() {
			found := false
			for _, p := range m.pdbs {
				sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
				if err != nil || sel.Empty() || p.Namespace != d.namespace || !sel.Matches(d.labels) {
					continue
				}
				found = true
				id := "PodDisruptionBudget/" + p.Name
				if (p.Spec.MinAvailable == nil) == (p.Spec.MaxUnavailable == nil) {
					t.Errorf("%s: set exactly one of minAvailable and maxUnavailable", id)
				}
				replicas := d.replicas
				if v := p.Spec.MinAvailable; v != nil && v.Type == intstr.Int && v.IntValue() >= replicas {
					t.Errorf("%s: minAvailable %d with %d replicas blocks every eviction (node drains hang)", id, v.IntValue(), replicas)
				}
				if v := p.Spec.MaxUnavailable; v != nil && (v.Type == intstr.Int && v.IntValue() < 1 || v.Type == intstr.String && v.StrVal == "0%") {
					t.Errorf("%s: maxUnavailable %s blocks every eviction", id, v.String())
				}
			}
			if !found {
				t.Errorf("no PodDisruptionBudget selects the pods of %s", d.owner)
			}
		}
	})

	t.Run("ServiceMonitors", func(t *testing.T) {
		for _, sm := range m.serviceMonitors {
			id := "ServiceMonitor/" + sm.Name
			sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
			if err != nil || sel.Empty() {
				t.Errorf("%s: selector: want a non-empty selector (%v)", id, err)
				continue
			}
			namespaces := sm.Spec.NamespaceSelector.MatchNames
			if len(namespaces) == 0 && !sm.Spec.NamespaceSelector.Any {
				namespaces = []string{sm.Namespace}
			}
			if len(sm.Spec.Endpoints) == 0 {
				t.Errorf("%s: no endpoints", id)
			}
			matched := 0
			for _, s := range m.services {
				if !sel.Matches(labels.Set(s.Labels)) || !sm.Spec.NamespaceSelector.Any && !slices.Contains(namespaces, s.Namespace) {
					continue
				}
				matched++
				for _, ep := range sm.Spec.Endpoints {
					if ep.Port == "" {
						t.Errorf("%s: an endpoint without a port name", id)
						continue
					}
					if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
						t.Errorf("%s: endpoint port %q is not a port of Service/%s", id, ep.Port, s.Name)
					}
				}
			}
			if matched == 0 {
				t.Errorf("%s: selects no Service of deploy/k8s", id)
			}
		}
	})

	t.Run("kustomization", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(deployDir, "k8s", kustomizationFile))
		if errors.Is(err, os.ErrNotExist) {
			t.Skip("no kustomization.yaml")
		}
		if err != nil {
			t.Fatal(err)
		}
		var k kustomization
		if err := yaml.UnmarshalStrict(b, &k); err != nil {
			t.Fatalf("%s: %v", kustomizationFile, err)
		}
		if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
			t.Errorf("%s: apiVersion %q kind %q", kustomizationFile, k.APIVersion, k.Kind)
		}
		listed := map[string]bool{}
		for _, r := range k.Resources {
			listed[r] = true
			if _, err := os.Stat(filepath.Join(deployDir, "k8s", r)); err != nil {
				t.Errorf("%s: resource %s: %v", kustomizationFile, r, err)
			}
		}
		// Every manifest is applied with -k, except those that need a CRD
		// (ServiceMonitor): applied without it, they would fail the lot.
		for f, crdOnly := range m.crdOnly {
			switch {
			case !listed[f] && !crdOnly:
				t.Errorf("%s does not list %s", kustomizationFile, f)
			case listed[f] && crdOnly:
				t.Errorf("%s lists %s, which needs a CRD: apply it separately", kustomizationFile, f)
			}
		}
	})
}

// pod is a Deployment's or StatefulSet's pod template, for Services and
// PDBs to select.
type pod struct {
	owner      string // Kind/name
	namespace  string
	labels     labels.Set
	containers []corev1.Container
	replicas   int
}

// workloads are the pod templates of every Deployment and StatefulSet.
func (m *manifests) workloads() []pod {
	var out []pod
	for _, d := range m.deployments {
		out = append(out, pod{owner: "Deployment/" + d.Name, namespace: d.Namespace, labels: d.Spec.Template.Labels, containers: d.Spec.Template.Spec.Containers, replicas: replicasOf(d)})
	}
	for _, ss := range m.statefulSets {
		r := 1
		if ss.Spec.Replicas != nil {
			r = int(*ss.Spec.Replicas)
		}
		out = append(out, pod{owner: "StatefulSet/" + ss.Name, namespace: ss.Namespace, labels: ss.Spec.Template.Labels, containers: ss.Spec.Template.Spec.Containers, replicas: r})
	}
	return out
}

func (m *manifests) podsSelectedBy(namespace string, sel labels.Selector) []pod {
	var out []pod
	for _, p := range m.workloads() {
		if p.namespace == namespace && sel.Matches(p.labels) {
			out = append(out, p)
		}
	}
	return out
}

func replicasOf(d *appsv1.Deployment) int {
	if d.Spec.Replicas == nil {
		return 1 // the API default
	}
	return int(*d.Spec.Replicas)
}

// resolvePort finds a container port by name or number.
func resolvePort(containers []corev1.Container, p intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, c := range containers {
		for _, cp := range c.Ports {
			if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
				return cp, true
			}
		}
	}
	return corev1.ContainerPort{}, false
}

func checkDeployment(t *testing.T, m *manifests, c *cli, d *appsv1.Deployment) {
	spec := d.Spec.Template.Spec
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	switch {
	case err != nil:
		t.Errorf("selector: %v", err)
	case sel.Empty():
		t.Error("empty selector: it would select every pod of the namespace")
	case !sel.Matches(podLabels):
		t.Errorf("selector %v does not match the pod labels %v", sel, podLabels)
	}
	for _, e := range metavalidation.ValidateLabels(podLabels, field.NewPath("spec", "template", "metadata", "labels")) {
		t.Error(e)
	}
	if replicasOf(d) < 2 {
		t.Errorf("replicas %d: a horizontally scaled cloud wants at least 2", replicasOf(d))
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("pod securityContext.runAsNonRoot is not true")
	}
	for _, tsc := range spec.TopologySpreadConstraints {
		s, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
		if err != nil || !s.Matches(podLabels) {
			t.Errorf("topologySpreadConstraint %s: labelSelector does not match the pod labels (%v)", tsc.TopologyKey, err)
		}
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		if _, dup := volumes[v.Name]; dup {
			t.Errorf("volume %s: defined twice", v.Name)
		}
		volumes[v.Name] = v
		switch {
		case v.ConfigMap != nil:
			cm := m.configMap(d.Namespace, v.ConfigMap.Name)
			if cm == nil {
				t.Errorf("volume %s: ConfigMap %s is not in deploy/k8s", v.Name, v.ConfigMap.Name)
				continue
			}
			for _, it := range v.ConfigMap.Items {
				if _, ok := cm.Data[it.Key]; !ok {
					t.Errorf("volume %s: ConfigMap %s has no key %s", v.Name, cm.Name, it.Key)
				}
			}
		case v.PersistentVolumeClaim != nil:
			pvc := m.pvc(d.Namespace, v.PersistentVolumeClaim.ClaimName)
			if pvc == nil {
				t.Errorf("volume %s: PersistentVolumeClaim %s is not in deploy/k8s", v.Name, v.PersistentVolumeClaim.ClaimName)
				continue
			}
			// Replicas on several nodes share it: ReadWriteOnce would pin
			// them all to one node.
			if replicasOf(d) > 1 && !slices.Contains(pvc.Spec.AccessModes, corev1.ReadOnlyMany) && !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) {
				t.Errorf("volume %s: PersistentVolumeClaim %s is %v: %d replicas need ReadOnlyMany or ReadWriteMany", v.Name, pvc.Name, pvc.Spec.AccessModes, replicasOf(d))
			}
			if slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}) && !v.PersistentVolumeClaim.ReadOnly {
				t.Errorf("volume %s: a ReadOnlyMany claim must be mounted readOnly", v.Name)
			}
			if _, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
				t.Errorf("PersistentVolumeClaim %s: no storage request", pvc.Name)
			}
		}
	}

	if len(spec.Containers) == 0 {
		t.Fatal("no containers")
	}
	var allPorts []corev1.ContainerPort
	for _, ctr := range spec.Containers {
		allPorts = append(allPorts, ctr.Ports...)
	}
	if v, ok := d.Spec.Template.Annotations["prometheus.io/scrape"]; ok && v == "true" {
		n, err := strconv.Atoi(d.Spec.Template.Annotations["prometheus.io/port"])
		if err != nil || !slices.ContainsFunc(allPorts, func(p corev1.ContainerPort) bool { return int(p.ContainerPort) == n }) {
			t.Errorf("prometheus.io/port %q is not a container port", d.Spec.Template.Annotations["prometheus.io/port"])
		}
		if p := d.Spec.Template.Annotations["prometheus.io/path"]; p != "" && !strings.HasPrefix(p, "/") {
			t.Errorf("prometheus.io/path %q: want an absolute path", p)
		}
	}

	for _, ctr := range spec.Containers {
		id := "container " + ctr.Name
		names := map[string]bool{}
		for _, p := range ctr.Ports {
			for _, msg := range validation.IsValidPortName(p.Name) {
				t.Errorf("%s: port name %q: %s", id, p.Name, msg)
			}
			if names[p.Name] {
				t.Errorf("%s: port name %q twice", id, p.Name)
			}
			names[p.Name] = true
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okReq := ctr.Resources.Requests[r]
			lim, okLim := ctr.Resources.Limits[r]
			switch {
			case !okReq || !okLim:
				t.Errorf("%s: %s needs both a request and a limit", id, r)
			case req.Cmp(lim) > 0:
				t.Errorf("%s: %s request %s exceeds its limit %s", id, r, req.String(), lim.String())
			case req.Sign() <= 0:
				t.Errorf("%s: %s request %s: want it positive", id, r, req.String())
			}
		}
		if ctr.ReadinessProbe == nil || ctr.LivenessProbe == nil {
			t.Errorf("%s: needs readiness and liveness probes", id)
		}
		for name, p := range map[string]*corev1.Probe{"readiness": ctr.ReadinessProbe, "liveness": ctr.LivenessProbe, "startup": ctr.StartupProbe} {
			if p != nil {
				checkProbe(t, id+": "+name+" probe", ctr, p)
			}
		}
		mounts := map[string]corev1.VolumeMount{}
		for _, vm := range ctr.VolumeMounts {
			if _, ok := volumes[vm.Name]; !ok {
				t.Errorf("%s: volumeMount %s: no such volume", id, vm.Name)
			}
			if !path.IsAbs(vm.MountPath) {
				t.Errorf("%s: volumeMount %s: mountPath %q is not absolute", id, vm.Name, vm.MountPath)
			}
			if _, dup := mounts[vm.MountPath]; dup {
				t.Errorf("%s: two volumes mounted at %s", id, vm.MountPath)
			}
			mounts[vm.MountPath] = vm
		}
		for _, e := range ctr.Env {
			if strings.Contains(e.Name, "TOKEN") && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
				t.Errorf("%s: env %s: a token comes from a Secret (valueFrom.secretKeyRef), never a literal", id, e.Name)
			}
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && (r.SecretKeyRef.Name == "" || r.SecretKeyRef.Key == "") {
				t.Errorf("%s: env %s: secretKeyRef needs a name and a key", id, e.Name)
			}
		}
		for _, a := range append(slices.Clone(ctr.Command), ctr.Args...) {
			if strings.Contains(a, "--token=") || strings.Contains(a, "--cloud-token=") || a == "--token" || a == "--cloud-token" {
				t.Errorf("%s: a token on the command line shows in ps: use $DRAGON_TOKEN from a Secret", id)
			}
		}
		checkDragonContainer(t, m, c, d, ctr, volumes, mounts)
	}
}

func checkProbe(t *testing.T, id string, ctr corev1.Container, p *corev1.Probe) {
	h := p.ProbeHandler
	n := 0
	for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%s: want exactly one handler, have %d", id, n)
		return
	}
	switch {
	case h.HTTPGet != nil:
		if _, ok := resolvePort([]corev1.Container{ctr}, h.HTTPGet.Port); !ok {
			t.Errorf("%s: port %s is not a port of the container", id, h.HTTPGet.Port.String())
		}
		if !strings.HasPrefix(h.HTTPGet.Path, "/") {
			t.Errorf("%s: path %q: want an absolute path", id, h.HTTPGet.Path)
		}
	case h.TCPSocket != nil:
		if _, ok := resolvePort([]corev1.Container{ctr}, h.TCPSocket.Port); !ok {
			t.Errorf("%s: port %s is not a port of the container", id, h.TCPSocket.Port.String())
		}
	case h.GRPC != nil:
		// gRPC probes take a number only, not a port name.
		if _, ok := resolvePort([]corev1.Container{ctr}, intstr.FromInt32(h.GRPC.Port)); !ok {
			t.Errorf("%s: gRPC port %d is not a port of the container", id, h.GRPC.Port)
		}
	}
}

func (m *manifests) configMap(ns, name string) *corev1.ConfigMap {
	for _, c := range m.configMaps {
		if c.Namespace == ns && c.Name == name {
			return c
		}
	}
	return nil
}

func (m *manifests) pvc(ns, name string) *corev1.PersistentVolumeClaim {
	for _, p := range m.pvcs {
		if p.Namespace == ns && p.Name == name {
			return p
		}
	}
	return nil
}

// mountOf finds the mount a file path lies under.
func mountOf(mounts map[string]corev1.VolumeMount, file string) (corev1.VolumeMount, bool) {
	best := ""
	for mp := range mounts {
		if (file == mp || strings.HasPrefix(file, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best = mp
		}
	}
	vm, ok := mounts[best]
	return vm, ok
}

// checkDragonContainer checks a container running dragon against the CLI
// and its --config file: a real subcommand and flags, the addresses it
// serves on are its container ports, the files it reads are mounted, and
// probes suit what each port speaks.
func checkDragonContainer(t *testing.T, m *manifests, c *cli, d *appsv1.Deployment, ctr corev1.Container, volumes map[string]corev1.Volume, mounts map[string]corev1.VolumeMount) {
	id := "container " + ctr.Name
	if len(ctr.Command) > 0 {
		t.Errorf("%s: command overrides the image's dragon entrypoint; put the subcommand in args", id)
	}
	sub, vals := c.checkArgs(t, id+" args", ctr.Args)
	if sub == "" {
		return
	}
	// The effective flags: --config file first, the command line over it.
	eff := map[string]string{}
	if cfg := vals["config"]; cfg != "" {
		vm, ok := mountOf(mounts, cfg)
		if !ok {
			t.Errorf("%s: --config %s is on no volume", id, cfg)
		} else if v := volumes[vm.Name]; v.ConfigMap == nil {
			t.Errorf("%s: --config %s: volume %s is not a ConfigMap", id, cfg, vm.Name)
		} else if cm := m.configMap(d.Namespace, v.ConfigMap.Name); cm != nil {
			key := strings.TrimPrefix(strings.TrimPrefix(cfg, vm.MountPath), "/")
			for _, it := range v.ConfigMap.Items {
				if it.Path == key {
					key = it.Key
				}
			}
			text, ok := cm.Data[key]
			if !ok {
				t.Errorf("%s: --config %s: ConfigMap %s has no key %s", id, cfg, cm.Name, key)
			}
			// The file's shape, as dragon reads it: a map per command of
			// flag names to scalars (or lists for repeatable flags).
			var file map[string]map[string]any
			if err := yaml.UnmarshalStrict([]byte(text), &file); err != nil {
				t.Errorf("ConfigMap %s key %s: %v", cm.Name, key, err)
			}
			for cmd, flags := range file {
				if _, ok := c.flags[cmd]; !ok && !c.subcommands[cmd] {
					t.Errorf("ConfigMap %s: %q is not a dragon command", cm.Name, cmd)
					continue
				}
				for f, v := range flags {
					if _, ok := c.flags[cmd][f]; !ok && c.flags[cmd] != nil {
						t.Errorf("ConfigMap %s: dragon %s has no flag %q", cm.Name, cmd, f)
					}
					if strings.Contains(f, "token") {
						t.Errorf("ConfigMap %s: %s.%s: tokens belong in a Secret", cm.Name, cmd, f)
					}
					if cmd == sub {
						eff[f] = fmt.Sprint(v)
					}
				}
			}
		}
	}
	for k, v := range vals {
		eff[k] = v
	}

	// Ports: what dragon listens on is exactly what the container exposes.
	served := map[string]bool{}
	for _, f := range []string{"listen", "http"} {
		addr := eff[f]
		if addr == "" {
			t.Errorf("%s: --%s is not set: the default is loopback, unreachable from outside the pod", id, f)
			continue
		}
		if h := host(addr); h != "0.0.0.0" && h != "" && h != "::" {
			t.Errorf("%s: --%s %s: listen on all addresses (0.0.0.0) in a pod", id, f, addr)
		}
		p, _ := strconv.Atoi(port(addr))
		if _, ok := resolvePort([]corev1.Container{ctr}, intstr.FromInt(p)); !ok {
			t.Errorf("%s: --%s %s: port %d is not a container port", id, f, addr, p)
		}
		served[port(addr)] = true
	}
	for _, cp := range ctr.Ports {
		if !served[strconv.Itoa(int(cp.ContainerPort))] {
			t.Errorf("%s: container port %s/%d: dragon serves nothing there", id, cp.Name, cp.ContainerPort)
		}
	}
	// Off loopback, dragon wants TLS or an explicit --insecure.
	tls := eff["tls-cert"] != ""
	if !tls && eff["insecure"] != "true" {
		t.Errorf("%s: --listen %s is not loopback: set tls-cert/tls-key (or --insecure)", id, eff["listen"])
	}
	if tls && eff["tls-key"] == "" {
		t.Errorf("%s: tls-cert without tls-key", id)
	}
	// The kubelet's gRPC probe speaks plaintext only.
	grpcPort, _ := strconv.Atoi(port(eff["listen"]))
	for name, p := range map[string]*corev1.Probe{"readiness": ctr.ReadinessProbe, "liveness": ctr.LivenessProbe, "startup": ctr.StartupProbe} {
		if p != nil && p.GRPC != nil && tls && int(p.GRPC.Port) == grpcPort {
			t.Errorf("%s: %s probe: gRPC probe on the TLS port %d always fails; probe HTTP /readyz, /healthz on --http", id, name, grpcPort)
		}
		if p != nil && p.HTTPGet != nil {
			cp, _ := resolvePort([]corev1.Container{ctr}, p.HTTPGet.Port)
			if strconv.Itoa(int(cp.ContainerPort)) != port(eff["http"]) {
				t.Errorf("%s: %s probe: HTTP on port %d, but dragon's HTTP (/healthz, /readyz) is on %s", id, name, cp.ContainerPort, eff["http"])
			}
			if !slices.Contains([]string{"/healthz", "/readyz"}, p.HTTPGet.Path) {
				t.Errorf("%s: %s probe: dragon serves /healthz and /readyz, not %s", id, name, p.HTTPGet.Path)
			}
		}
	}
	if ctr.ReadinessProbe != nil && ctr.ReadinessProbe.HTTPGet != nil && ctr.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("%s: readiness probe: /readyz is the one that turns 503 on SIGTERM", id)
	}

	// An index URL names a Service of deploy/k8s in front of a
	// StatefulSet's pods, on a port it serves.
	if ix := eff["index"]; strings.HasPrefix(ix, "weaviate://") || strings.HasPrefix(ix, "weaviate+https://") {
		checkIndexURL(t, m, id, d.Namespace, ix)
	}
	// Files dragon reads are on mounted volumes, and the model and index
	// on read-only ones.
	for _, f := range []string{"model", "index", "tls-cert", "tls-key", "tls-ca"} {
		file := eff[f]
		if file == "" || f == "index" && strings.Contains(file, "://") {
			continue
		}
		if !path.IsAbs(file) {
			t.Errorf("%s: --%s %s: want an absolute path", id, f, file)
			continue
		}
		vm, ok := mountOf(mounts, file)
		if !ok {
			t.Errorf("%s: --%s %s is on no mounted volume", id, f, file)
			continue
		}
		if !vm.ReadOnly {
			t.Errorf("%s: --%s %s: volume %s should be mounted readOnly", id, f, file, vm.Name)
		}
	}
	if eff["model"] == "" {
		t.Errorf("%s: no --model: the default is relative to the working directory", id)
	}

	// Shutdown: the pod must outlive the drain of generations in flight.
	drain := 30 * time.Second // dragon's default --drain-timeout
	if v := eff["drain-timeout"]; v != "" {
		var err error
		if drain, err = time.ParseDuration(v); err != nil {
			t.Errorf("%s: drain-timeout %q: %v", id, v, err)
		}
	}
	grace := 30 * time.Second // the API default
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if lc := ctr.Lifecycle; lc != nil && lc.PreStop != nil && lc.PreStop.Sleep != nil {
		grace -= time.Duration(lc.PreStop.Sleep.Seconds) * time.Second
	}
	if grace <= drain {
		t.Errorf("%s: terminationGracePeriodSeconds (less preStop) %v does not exceed --drain-timeout %v: generations are killed mid-drain", id, grace, drain)
	}

	// --threads beyond the CPU limit oversubscribes the cores llama.cpp
	// spins on.
	if v := eff["threads"]; v != "" {
		n, err := strconv.Atoi(v)
		lim := ctr.Resources.Limits[corev1.ResourceCPU]
		if err != nil {
			t.Errorf("%s: threads %q: %v", id, v, err)
		} else if lim.Cmp(*resource.NewQuantity(int64(n), resource.DecimalSI)) < 0 {
			t.Errorf("%s: --threads %d exceeds the CPU limit %s", id, n, lim.String())
		}
	}
}

// checkIndexURL checks a weaviate:// --index against the manifests: its
// host is a Service (by name, or its cluster DNS name) selecting a
// StatefulSet's pods, its port (and the gRPC port of ?grpc=:PORT) one the
// Service serves, and the collection a valid name.
func checkIndexURL(t *testing.T, m *manifests, id, namespace, raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("%s: --index %s: %v", id, raw, err)
		return
	}
	coll := strings.Trim(u.Path, "/")
	if coll == "" || coll[0] < 'A' || coll[0] > 'Z' {
		t.Errorf("%s: --index %s: the collection must start with a capital letter", id, raw)
	}
	host, portStr := u.Hostname(), u.Port()
	name, ns, _ := strings.Cut(host, ".")
	if ns != "" {
		ns, _, _ = strings.Cut(ns, ".")
	} else {
		ns = namespace
	}
	for _, s := range m.services {
		if s.Name != name || s.Namespace != ns {
			continue
		}
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			t.Errorf("%s: --index %s: Service/%s is headless; point at the one that balances", id, raw, s.Name)
		}
		ports := []string{portStr}
		if g := u.Query().Get("grpc"); g != "" {
			gh, gp, err := net.SplitHostPort(g)
			if err != nil || gh != "" && gh != host {
				t.Errorf("%s: --index %s: grpc=%s: want :PORT on the Service's host", id, raw, g)
			}
			ports = append(ports, gp)
		}
		for _, port := range ports {
			if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == port }) {
				t.Errorf("%s: --index %s: Service/%s serves no port %s", id, raw, s.Name, port)
			}
		}
		pods := m.podsSelectedBy(s.Namespace, labels.SelectorFromSet(s.Spec.Selector))
		if !slices.ContainsFunc(pods, func(p pod) bool { return strings.HasPrefix(p.owner, "StatefulSet/") }) {
			t.Errorf("%s: --index %s: Service/%s selects no StatefulSet's pods", id, raw, s.Name)
		}
		return
	}
	t.Errorf("%s: --index %s: no Service %s in namespace %s", id, raw, name, ns)
}

// checkStatefulSet checks the retrieval engine's StatefulSet: a stable
// network identity through a headless Service, storage that outlives the
// pod, probes, limits, and a Raft configuration that matches the replicas.
func checkStatefulSet(t *testing.T, m *manifests, ss *appsv1.StatefulSet) {
	id := "StatefulSet/" + ss.Name
	replicas := 1
	if ss.Spec.Replicas != nil {
		replicas = int(*ss.Spec.Replicas)
	}
	if replicas < 3 {
		t.Errorf("%s: %d replicas: a replicated collection needs 3 nodes to lose one", id, replicas)
	}
	sel, err := metav1.LabelSelectorAsSelector(ss.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(ss.Spec.Template.Labels)) {
		t.Errorf("%s: selector %v does not select its own pod template", id, ss.Spec.Selector)
	}
	headless := false
	for _, s := range m.services {
		if s.Name == ss.Spec.ServiceName && s.Namespace == ss.Namespace {
			headless = s.Spec.ClusterIP == corev1.ClusterIPNone && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(ss.Spec.Template.Labels))
		}
	}
	if !headless {
		t.Errorf("%s: serviceName %q is not a headless Service selecting its pods", id, ss.Spec.ServiceName)
	}
	if len(ss.Spec.VolumeClaimTemplates) == 0 {
		t.Errorf("%s: no volumeClaimTemplates: a node's data would not outlive its pod", id)
	}
	for _, ctr := range ss.Spec.Template.Spec.Containers {
		cid := id + ": container " + ctr.Name
		if i := strings.LastIndex(ctr.Image, ":"); i < 0 || strings.HasSuffix(ctr.Image, ":latest") {
			t.Errorf("%s: image %q: pin a version", cid, ctr.Image)
		}
		if ctr.ReadinessProbe == nil || ctr.LivenessProbe == nil {
			t.Errorf("%s: needs readiness and liveness probes", cid)
		}
		if ctr.Resources.Limits.Memory().IsZero() || ctr.Resources.Requests.Cpu().IsZero() {
			t.Errorf("%s: set memory limits and CPU requests", cid)
		}
		for _, vct := range ss.Spec.VolumeClaimTemplates {
			if !slices.ContainsFunc(ctr.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.Name == vct.Name }) {
				t.Errorf("%s: does not mount volume claim %s", cid, vct.Name)
			}
		}
		env := map[string]string{}
		for _, e := range ctr.Env {
			env[e.Name] = e.Value
		}
		// The engine deployed is the one the tests run; releases before
		// 1.38.3 also drop passages of the true BM25 top k with BlockMax
		// WAND, which the StatefulSet turns on.
		// The tag follows the last colon (a registry may name a port).
		if i := strings.LastIndex(ctr.Image, ":"); i > 0 && strings.HasSuffix(ctr.Image[:i], "semitechnologies/weaviate") {
			if want := testedWeaviateVersion(t); "v"+ctr.Image[i+1:] != want {
				t.Errorf("%s: image %s, but the tests run Weaviate %s (Makefile WEAVIATE_VERSION): deploy the version tested", cid, ctr.Image, want)
			}
		}
		if v, ok := env["RAFT_BOOTSTRAP_EXPECT"]; ok && v != strconv.Itoa(replicas) {
			t.Errorf("%s: RAFT_BOOTSTRAP_EXPECT %s with %d replicas: Raft never elects a leader", cid, v, replicas)
		}
		if v, ok := env["RAFT_JOIN"]; ok {
			var want []string
			for i := range replicas {
				want = append(want, fmt.Sprintf("%s-%d", ss.Name, i))
			}
			if v != strings.Join(want, ",") {
				t.Errorf("%s: RAFT_JOIN %q, want the pods' names %q", cid, v, strings.Join(want, ","))
			}
		}
	}
	if ss.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("%s: podManagementPolicy %q: nodes must start together (none is ready until Raft has its voters)", id, ss.Spec.PodManagementPolicy)
	}
}

// testedWeaviateVersion is the Makefile's WEAVIATE_VERSION: the release
// make weaviate builds and the tests start.
func testedWeaviateVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoDir, "Makefile"))
	if err != nil {
		t.Fatalf("reading the Makefile: %v", err)
	}
	m := regexp.MustCompile(`(?m)^WEAVIATE_VERSION := (v\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Makefile sets no WEAVIATE_VERSION")
	}
	return string(m[1])
}
