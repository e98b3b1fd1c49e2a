// Package check tests the Helm chart in deploy/helm/kvtier: helm lint,
// helm template with the default values, the example's values and the
// hostPath pool, every rendered object decoded strictly (unknown, duplicate
// or miscased fields fail) into the pinned Kubernetes and prometheus-operator
// types, the facts the engines depend on, a golden file of the default
// render, kvtierd itself accepting each render's flags, environment and
// config file, and the chart's copies of the alert rules and the dashboard
// equal to deploy/prometheus and deploy/grafana. A separate module, so that
// kvtier's own module takes no Kubernetes dependency.
//
// Run by bash scripts/helm-check.sh (which installs the pinned helm), or
// here with HELM=/path/to/helm go test ./... ; -update rewrites
// testdata/default.golden.yaml. Without helm the tests fail, unless
// KVTIER_HELM_OPTIONAL=1 (then they skip).
package check

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite testdata/default.golden.yaml from the chart's default render")

const (
	chartDir     = "../kvtier"
	repoRoot     = "../../.."
	vllmValues   = chartDir + "/examples/vllm-values.yaml"
	vllmExample  = chartDir + "/examples/vllm-deployment.yaml"
	goldenFile   = "testdata/default.golden.yaml"
	releaseName  = "kvtier"
	namespace    = "kvtier"
	metricsPort  = 9464
	containerUID = 65532
)

// helmBin: $HELM, else helm on PATH. Missing, the test fails, or skips with
// KVTIER_HELM_OPTIONAL=1.
func helmBin(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		if _, err := os.Stat(h); err != nil {
			t.Fatalf("HELM=%s: %v", h, err)
		}
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	if os.Getenv("KVTIER_HELM_OPTIONAL") == "1" {
		t.Skip("no helm (HELM unset, none on PATH) and KVTIER_HELM_OPTIONAL=1: bash scripts/helm-check.sh installs the pinned one")
	}
	t.Fatal("no helm: set HELM or put helm on PATH (bash scripts/helm-check.sh installs the pinned one), or KVTIER_HELM_OPTIONAL=1 to skip")
	return ""
}

// runHelm runs helm with args; stdout, or an error carrying stderr.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// render is `helm template` of the chart with extra args (values).
func render(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runHelm(t, append([]string{"template", releaseName, chartDir, "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// decodeStrict decodes one YAML document as the API server would: unknown
// fields, duplicate fields and fields spelled in another case are errors.
func decodeStrict(doc []byte, into any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, into)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return strictErrors(strict)
	}
	return nil
}

type strictErrors []error

func (es strictErrors) Error() string {
	var s []string
	for _, e := range es {
		s = append(s, e.Error())
	}
	return strings.Join(s, "; ")
}

// objects is one render, decoded.
type objects struct {
	daemonSets      []*appsv1.DaemonSet
	configMaps      []*corev1.ConfigMap
	services        []*corev1.Service
	serviceMonitors []*monitoringv1.ServiceMonitor
	prometheusRules []*monitoringv1.PrometheusRule
}

// pinnedKinds is every kind the chart is known to make: its apiVersion,
// and how a document of it is decoded into objects. One table, so that a
// kind the chart starts making is added in one place.
var pinnedKinds = map[string]struct {
	apiVersion string
	add        func(*objects) metav1.Object
}{
	"DaemonSet":      {"apps/v1", func(o *objects) metav1.Object { return appendNew(&o.daemonSets) }},
	"ConfigMap":      {"v1", func(o *objects) metav1.Object { return appendNew(&o.configMaps) }},
	"Service":        {"v1", func(o *objects) metav1.Object { return appendNew(&o.services) }},
	"ServiceMonitor": {"monitoring.coreos.com/v1", func(o *objects) metav1.Object { return appendNew(&o.serviceMonitors) }},
	"PrometheusRule": {"monitoring.coreos.com/v1", func(o *objects) metav1.Object { return appendNew(&o.prometheusRules) }},
}

// appendNew appends a new, empty object to list and returns it, for a
// document to be decoded into: the one step every kind shares.
func appendNew[T any](list *[]*T) *T {
	v := new(T)
	*list = append(*list, v)
	return v
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeRender splits a multi-document render and decodes every object by
// its kind into the pinned types; a kind the chart is not known to make, an
// apiVersion other than the kind's, or an invalid name or label fails.
func decodeRender(t *testing.T, text string) objects {
	t.Helper()
	var o objects
	n := 0
	for _, doc := range docSep.Split(text, -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("a rendered document is not YAML: %v\n%s", err, doc)
		}
		if head.Kind == "" && head.APIVersion == "" {
			if strings.TrimSpace(stripComments(doc)) != "" {
				t.Fatalf("a rendered document has no kind:\n%s", doc)
			}
			continue // comments only
		}
		n++
		kind, ok := pinnedKinds[head.Kind]
		if !ok {
			t.Fatalf("the chart renders a %s %s, which this test does not decode: add it", head.APIVersion, head.Kind)
		}
		wantAPI := kind.apiVersion
		if head.APIVersion != wantAPI {
			t.Fatalf("%s has apiVersion %q, want %q", head.Kind, head.APIVersion, wantAPI)
		}
		obj := kind.add(&o)
		if err := decodeStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s does not decode strictly as %s %s: %v\n%s", head.Kind, wantAPI, head.Kind, err, firstLines(doc, 12))
		}
		checkMeta(t, head.Kind, obj)
	}
	if n == 0 {
		t.Fatal("the render holds no object")
	}
	return o
}

func stripComments(doc string) string {
	var keep []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, "\n")
}

// checkMeta: a valid name and labels (the API server's rules).
func checkMeta(t *testing.T, kind string, m metav1.Object) {
	t.Helper()
	name := m.GetName()
	if name == "" {
		t.Fatalf("a %s has no name", kind)
	}
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		t.Errorf("%s %s: name: %s", kind, name, msg)
	}
	if kind == "Service" {
		for _, msg := range validation.IsDNS1035Label(name) {
			t.Errorf("Service %s: name: %s", name, msg)
		}
	}
	if errs := metav1validation.ValidateLabels(m.GetLabels(), field.NewPath("metadata", "labels")); len(errs) > 0 {
		t.Errorf("%s %s: %v", kind, name, errs.ToAggregate())
	}
}

// want is what the DaemonSet must say for a set of values.
type want struct {
	socketDir  string // the hostPath of the engine socket
	poolPath   string // --pool-path
	hostIPC    bool   // pool.mode hostIPC
	poolBytes  string // KVTIER_POOL_BYTES
	blockBytes string // KVTIER_BLOCK_BYTES, "" for none
	memory     string // the memory request and limit
	config     bool   // a ConfigMap passed as --config
}

// checkDaemonSet asserts the facts engines and operators depend on.
func checkDaemonSet(t *testing.T, o objects, w want) (*appsv1.DaemonSet, *corev1.Container) {
	t.Helper()
	if len(o.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(o.daemonSets))
	}
	ds := o.daemonSets[0]
	pod := ds.Spec.Template.Spec
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("the selector %v does not select the pod template's labels %v (%v)", ds.Spec.Selector, ds.Spec.Template.Labels, err)
	}
	if pod.HostIPC != w.hostIPC {
		t.Errorf("hostIPC %v, want %v", pod.HostIPC, w.hostIPC)
	}
	if len(pod.Containers) != 1 || pod.Containers[0].Name != "kvtierd" {
		t.Fatalf("want one container, kvtierd: %v", pod.Containers)
	}
	c := &pod.Containers[0]

	// The engine socket: a hostPath, mounted at the same path, where
	// --engine-listen puts the socket.
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	mountOf := func(c *corev1.Container, path string) *corev1.VolumeMount {
		for i := range c.VolumeMounts {
			if c.VolumeMounts[i].MountPath == path {
				return &c.VolumeMounts[i]
			}
		}
		return nil
	}
	checkHostPath := func(what, path string) {
		t.Helper()
		m := mountOf(c, path)
		if m == nil {
			t.Errorf("kvtierd mounts nothing at %s (%s)", path, what)
			return
		}
		hp := vols[m.Name].HostPath
		if hp == nil || hp.Path != path || hp.Type == nil || *hp.Type != corev1.HostPathDirectoryOrCreate {
			t.Errorf("%s: volume %q is %+v, want hostPath %s DirectoryOrCreate", what, m.Name, vols[m.Name].VolumeSource, path)
		}
		if m.ReadOnly {
			t.Errorf("%s is mounted read-only", what)
		}
	}
	checkHostPath("the engine socket's directory", w.socketDir)
	if got := flagValue(c.Args, "--engine-listen"); got != "unix://"+w.socketDir+"/engine.sock" {
		t.Errorf("--engine-listen %q, want unix://%s/engine.sock", got, w.socketDir)
	}

	// The pool: in the host's /dev/shm (hostIPC) or in a hostPath mounted at
	// the same path; never in a volume the engines cannot see.
	if got := flagValue(c.Args, "--pool-path"); got != w.poolPath {
		t.Errorf("--pool-path %q, want %q", got, w.poolPath)
	}
	if w.hostIPC {
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(w.poolPath, m.MountPath+"/") {
				t.Errorf("with hostIPC the pool %s must be in the host's /dev/shm, but %s is a volume", w.poolPath, m.MountPath)
			}
		}
	} else {
		checkHostPath("the pool's directory", filepath.Dir(w.poolPath))
	}
	for _, v := range pod.Volumes {
		if v.EmptyDir != nil {
			t.Errorf("volume %q is an emptyDir: nothing of kvtierd's may be private to its pod", v.Name)
		}
	}

	// Probes on the metrics port, which --metrics-listen serves.
	if got := flagValue(c.Args, "--metrics-listen"); got != fmt.Sprintf("0.0.0.0:%d", metricsPort) {
		t.Errorf("--metrics-listen %q", got)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != metricsPort {
		t.Errorf("ports %+v, want metrics %d", c.Ports, metricsPort)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe", p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s: %s on %s, want %s on metrics", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
		}
	}

	// Security: user 65532, non-root, read-only root, no privilege.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != containerUID || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("pod securityContext %+v, want runAsUser %d and runAsNonRoot", psc, containerUID)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.RunAsUser != nil ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("kvtierd's securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, all capabilities dropped, the pod's user", sc)
	}
	// The init container hands the host directories to that user.
	if len(pod.InitContainers) != 1 {
		t.Errorf("%d init containers, want the socket-dir one", len(pod.InitContainers))
	} else {
		ic := &pod.InitContainers[0]
		wantCmd := []string{"chown", "65532:65532", w.socketDir}
		if !w.hostIPC {
			wantCmd = append(wantCmd, filepath.Dir(w.poolPath))
		}
		if !slices.Equal(ic.Command, wantCmd) {
			t.Errorf("init command %q, want %q", ic.Command, wantCmd)
		}
		for _, p := range wantCmd[2:] {
			if mountOf(ic, p) == nil {
				t.Errorf("the init container does not mount %s", p)
			}
		}
		if ic.SecurityContext == nil || ic.SecurityContext.Capabilities == nil ||
			!slices.Equal(ic.SecurityContext.Capabilities.Add, []corev1.Capability{"CHOWN"}) {
			t.Errorf("the init container should add CHOWN alone: %+v", ic.SecurityContext)
		}
	}

	// The environment: the pool's and the slots' sizes.
	env := map[string]string{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("env %s twice", e.Name)
		}
		env[e.Name] = e.Value
	}
	if got, ok := env["KVTIER_POOL_BYTES"]; !ok || got != w.poolBytes {
		t.Errorf("KVTIER_POOL_BYTES %q, want %q", got, w.poolBytes)
	}
	if got, ok := env["KVTIER_BLOCK_BYTES"]; ok != (w.blockBytes != "") || got != w.blockBytes {
		t.Errorf("KVTIER_BLOCK_BYTES %q (set: %v), want %q", got, ok, w.blockBytes)
	}

	// Memory: the pool's pages are charged to this container.
	wantMem := resource.MustParse(w.memory)
	pool := resource.MustParse(w.poolBytes)
	for name, rl := range map[string]corev1.ResourceList{"requests": c.Resources.Requests, "limits": c.Resources.Limits} {
		got, ok := rl[corev1.ResourceMemory]
		if !ok || got.Cmp(wantMem) != 0 {
			t.Errorf("memory %s %v, want %s", name, rl, w.memory)
		}
		if ok && got.Cmp(pool) <= 0 {
			t.Errorf("memory %s %s does not hold the pool, %s", name, got.String(), w.poolBytes)
		}
	}

	// The config file.
	cfg := flagValue(c.Args, "--config")
	if (cfg != "") != w.config {
		t.Errorf("--config %q, want one: %v", cfg, w.config)
	}
	if w.config {
		m := mountOf(c, filepath.Dir(cfg))
		if m == nil || !m.ReadOnly || vols[m.Name].ConfigMap == nil {
			t.Fatalf("--config %s: its directory is not a ConfigMap mounted read-only", cfg)
		}
		cm := configMap(t, o, vols[m.Name].ConfigMap.Name)
		if _, ok := cm.Data[filepath.Base(cfg)]; !ok {
			t.Errorf("ConfigMap %s has no %s", cm.Name, filepath.Base(cfg))
		}
		if ds.Spec.Template.Annotations["checksum/config"] == "" {
			t.Error("no checksum/config annotation: a config change would not roll the pods")
		}
	}
	return ds, c
}

// flagValue is the argument after name in args ("" when absent).
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func configMap(t *testing.T, o objects, name string) *corev1.ConfigMap {
	t.Helper()
	for _, cm := range o.configMaps {
		if cm.Name == name {
			return cm
		}
	}
	t.Fatalf("no ConfigMap %s", name)
	return nil
}

func checkService(t *testing.T, o objects, ds *appsv1.DaemonSet) *corev1.Service {
	t.Helper()
	if len(o.services) != 1 {
		t.Fatalf("%d Services, want 1", len(o.services))
	}
	svc := o.services[0]
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service clusterIP %q, want None (headless: each kvtierd scraped)", svc.Spec.ClusterIP)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].Port != metricsPort || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service ports %+v", svc.Spec.Ports)
	}
	return svc
}

// TestLint: helm lint --strict (warnings fail) on each set of values.
func TestLint(t *testing.T) {
	for _, args := range [][]string{nil, {"-f", vllmValues}, {"--set", "pool.mode=hostPath"}} {
		if out, err := runHelm(t, append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
			t.Error(err)
		} else if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("helm lint %v:\n%s", args, out)
		}
	}
}

// TestDefaultRender: the default values make a DaemonSet and a headless
// Service, nothing else, and the render equals the golden file.
func TestDefaultRender(t *testing.T) {
	out := render(t)
	o := decodeRender(t, out)
	ds, _ := checkDaemonSet(t, o, want{
		socketDir: "/run/kvtier", poolPath: "/dev/shm/kvtier.pool", hostIPC: true,
		poolBytes: "32Gi", memory: "33Gi",
	})
	checkService(t, o, ds)
	if len(o.configMaps)+len(o.serviceMonitors)+len(o.prometheusRules) != 0 {
		t.Errorf("the defaults render %d ConfigMaps, %d ServiceMonitors, %d PrometheusRules; want none",
			len(o.configMaps), len(o.serviceMonitors), len(o.prometheusRules))
	}
	if got := ds.Spec.Template.Spec.NodeSelector["nvidia.com/gpu.present"]; got != "true" {
		t.Errorf("nodeSelector %v", ds.Spec.Template.Spec.NodeSelector)
	}

	if *update {
		if err := os.WriteFile(goldenFile, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", goldenFile)
		return
	}
	golden, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("%v (go test -run TestDefaultRender -update writes it)", err)
	}
	if string(golden) != out {
		t.Errorf("the default render differs from %s (go test -run TestDefaultRender -update, then review the diff):\n%s",
			goldenFile, firstDiff(string(golden), out))
	}
}

// firstDiff shows the first line where two texts differ, with context.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl || i >= len(w) || i >= len(g) {
			return fmt.Sprintf("line %d:\n  golden: %q\n  render: %q", i+1, wl, gl)
		}
	}
	return "(no line differs)"
}

// TestVLLMValuesRender: the example's values: slots sized up front, a config
// file, and the monitoring objects, each as the source files say.
func TestVLLMValuesRender(t *testing.T) {
	o := decodeRender(t, render(t, "-f", vllmValues))
	ds, _ := checkDaemonSet(t, o, want{
		socketDir: "/run/kvtier", poolPath: "/dev/shm/kvtier.pool", hostIPC: true,
		poolBytes: "64Gi", blockBytes: "4MiB", memory: "65Gi", config: true,
	})
	svc := checkService(t, o, ds)

	// The ServiceMonitor scrapes the Service's metrics port.
	if len(o.serviceMonitors) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(o.serviceMonitors))
	}
	sm := o.serviceMonitors[0]
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(svc.Labels)) {
		t.Errorf("the ServiceMonitor's selector %v does not select the Service's labels %v", sm.Spec.Selector, svc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v", sm.Spec.Endpoints)
	}
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v: serviceMonitor.labels missing", sm.Labels)
	}

	// The PrometheusRule's groups are deploy/prometheus/kvtier.rules.yml's.
	if len(o.prometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(o.prometheusRules))
	}
	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	src, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/kvtier.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeStrict(src, &file); err != nil {
		t.Fatalf("deploy/prometheus/kvtier.rules.yml does not decode strictly as prometheus-operator rule groups: %v", err)
	}
	if len(file.Groups) == 0 || len(file.Groups[0].Rules) == 0 {
		t.Fatal("no rules in deploy/prometheus/kvtier.rules.yml")
	}
	gotGroups, _ := json.Marshal(o.prometheusRules[0].Spec.Groups)
	wantGroups, _ := json.Marshal(file.Groups)
	if !bytes.Equal(gotGroups, wantGroups) {
		t.Errorf("the PrometheusRule's groups differ from deploy/prometheus/kvtier.rules.yml's")
	}

	// The dashboard ConfigMap holds deploy/grafana/kvtier.json.
	dash := configMap(t, o, ds.Name+"-dashboard")
	if dash.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v, want grafana_dashboard: \"1\"", dash.Labels)
	}
	board, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/kvtier.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := dash.Data["kvtier.json"]; strings.TrimSpace(got) != strings.TrimSpace(string(board)) || !json.Valid([]byte(got)) {
		t.Errorf("the dashboard ConfigMap's kvtier.json (%d bytes) is not deploy/grafana/kvtier.json (%d bytes)", len(got), len(board))
	}
	if len(o.configMaps) != 2 {
		t.Errorf("%d ConfigMaps, want the config and the dashboard", len(o.configMaps))
	}
}

// TestHostPathPoolRender: pool.mode hostPath puts the pool in a hostPath
// mounted at the same path, without hostIPC; socketDir moves the socket.
func TestHostPathPoolRender(t *testing.T) {
	o := decodeRender(t, render(t, "--set", "pool.mode=hostPath", "--set", "pool.hostPath=/dev/shm/kv/",
		"--set", "socketDir=/var/run/kv", "--set", "poolBytes=64G", "--set", "memoryOverhead=512Mi"))
	checkDaemonSet(t, o, want{
		socketDir: "/var/run/kv", poolPath: "/dev/shm/kv/kvtier.pool", hostIPC: false,
		poolBytes: "64G", memory: fmt.Sprint(int64(64e9 + 512<<20)),
	})
}

// TestRenderRefuses: values that would make a broken DaemonSet fail the
// render, saying why.
func TestRenderRefuses(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"poolBytes=64Gi", "resources.limits.memory=64Gi"}, "must hold poolBytes"},
		{[]string{"poolBytes=64Gx"}, `poolBytes: "64Gx" is not a size`},
		{[]string{"pool.mode=emptyDir"}, "neither hostIPC nor hostPath"},
		{[]string{"serviceMonitor.enabled=true", "service.enabled=false"}, "needs service.enabled"},
	} {
		args := []string{"template", releaseName, chartDir}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		_, err := runHelm(t, args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %v: want an error saying %q, got %v", c.set, c.want, err)
		}
	}
}

// TestChartCopiesMatchDeploy: Helm reads only files inside the chart, so
// the chart carries copies of the alert rules and the dashboard; they must
// be the files deploy/prometheus and deploy/grafana hold (cp them over).
func TestChartCopiesMatchDeploy(t *testing.T) {
	for _, c := range []struct{ copy, source string }{
		{"files/kvtier.rules.yml", "deploy/prometheus/kvtier.rules.yml"},
		{"files/kvtier.json", "deploy/grafana/kvtier.json"},
	} {
		got, err := os.ReadFile(filepath.Join(chartDir, c.copy))
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.ReadFile(filepath.Join(repoRoot, c.source))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, src) {
			t.Errorf("deploy/helm/kvtier/%s differs from %s: cp %s deploy/helm/kvtier/%s", c.copy, c.source, c.source, c.copy)
		}
	}
}

var kvtierdOnce struct {
	sync.Once
	bin string
	err error
}

// kvtierd builds kvtier's daemon from the repository (once per run).
func kvtierd(t *testing.T) string {
	t.Helper()
	kvtierdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvtier-helm-check-")
		if err != nil {
			kvtierdOnce.err = err
			return
		}
		kvtierdOnce.bin = filepath.Join(dir, "kvtierd")
		cmd := exec.Command("go", "build", "-o", kvtierdOnce.bin, "./cmd/kvtierd")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			kvtierdOnce.err = fmt.Errorf("go build ./cmd/kvtierd: %v\n%s", err, out)
		}
	})
	if kvtierdOnce.err != nil {
		t.Fatal(kvtierdOnce.err)
	}
	return kvtierdOnce.bin
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if kvtierdOnce.bin != "" {
		os.RemoveAll(filepath.Dir(kvtierdOnce.bin))
	}
	os.Exit(code)
}

// TestKvtierdAcceptsRender: kvtierd, built from this repository, accepts
// each render's arguments, environment and config file (--print-topology
// reads and validates them all, then exits without opening anything): a
// misspelt config key or a size kvtierd cannot read fails here, not on a
// node.
func TestKvtierdAcceptsRender(t *testing.T) {
	for name, args := range map[string][]string{
		"default":  nil,
		"vllm":     {"-f", vllmValues},
		"hostPath": {"--set", "pool.mode=hostPath", "--set", "poolBytes=34359738368"},
	} {
		t.Run(name, func(t *testing.T) {
			o := decodeRender(t, render(t, args...))
			ds := o.daemonSets[0]
			c := ds.Spec.Template.Spec.Containers[0]
			argv := slices.Clone(c.Args)
			if cfg := flagValue(argv, "--config"); cfg != "" {
				local := filepath.Join(t.TempDir(), filepath.Base(cfg))
				cm := configMap(t, o, ds.Name)
				if err := os.WriteFile(local, []byte(cm.Data[filepath.Base(cfg)]), 0o644); err != nil {
					t.Fatal(err)
				}
				argv[slices.Index(argv, cfg)] = local
			}
			env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
			for _, e := range c.Env {
				v := e.Value
				if e.ValueFrom != nil {
					if e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
						t.Fatalf("env %s: a source this test cannot stand in for: %+v", e.Name, e.ValueFrom)
					}
					v = "node-1"
				}
				env = append(env, e.Name+"="+v)
			}
			cmd := exec.Command(kvtierd(t), append(argv, "--print-topology")...)
			cmd.Env = env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("kvtierd %s --print-topology (env %v): %v\n%s", strings.Join(argv, " "), env[2:], err, out)
			}
		})
	}
}

// TestVLLMDeploymentExample: the example vLLM Deployment decodes strictly
// and is wired to the chart as vllm-values.yaml renders it: the connector's
// config as README.md documents it plus kvtier_address on the chart's
// socket, the socket's hostPath at the same path, the host's /dev/shm, the
// same nodes, and KV events to the same router as kvtierd's.
func TestVLLMDeploymentExample(t *testing.T) {
	src, err := os.ReadFile(vllmExample)
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	if err := decodeStrict(src, &dep); err != nil {
		t.Fatalf("%s does not decode strictly as an apps/v1 Deployment: %v", vllmExample, err)
	}
	if dep.APIVersion != "apps/v1" || dep.Kind != "Deployment" {
		t.Fatalf("%s is a %s %s", vllmExample, dep.APIVersion, dep.Kind)
	}
	checkMeta(t, "Deployment", &dep.ObjectMeta)
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("the Deployment's selector does not select its pods")
	}

	o := decodeRender(t, render(t, "-f", vllmValues))
	ds := o.daemonSets[0]
	kc := ds.Spec.Template.Spec.Containers[0]
	socketDir := strings.TrimSuffix(strings.TrimPrefix(flagValue(kc.Args, "--engine-listen"), "unix://"), "/engine.sock")

	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want vllm", len(pod.Containers))
	}
	c := pod.Containers[0]

	// --kv-transfer-config: README.md's, plus kvtier_address and the
	// engine's events topic (kvtier_events_topic: kvtierd announces the
	// blocks this pod can load under it), the --kv-events-config topic.
	var got map[string]any
	if err := json.Unmarshal([]byte(flagValue(c.Args, "--kv-transfer-config")), &got); err != nil {
		t.Fatalf("--kv-transfer-config is not JSON: %v", err)
	}
	readme := readmeTransferConfig(t)
	extra, _ := readme["kv_connector_extra_config"].(map[string]any)
	if extra == nil || extra["spec_name"] != "KvtierOffloadingSpec" {
		t.Fatalf("README.md's --kv-transfer-config is not the one this test knows: %v", readme)
	}
	extra["kvtier_address"] = "unix://" + socketDir + "/engine.sock"
	var kvEvents map[string]any
	if err := json.Unmarshal([]byte(flagValue(c.Args, "--kv-events-config")), &kvEvents); err != nil {
		t.Fatalf("--kv-events-config is not JSON: %v", err)
	}
	if topic, _ := kvEvents["topic"].(string); !strings.HasPrefix(topic, "kv@$(POD_IP)@") {
		t.Errorf("--kv-events-config topic %q: llm-d's kv@$(POD_IP)@<model>", topic)
	}
	extra["kvtier_events_topic"] = kvEvents["topic"]
	if g, w := mustJSON(got), mustJSON(readme); g != w {
		t.Errorf("--kv-transfer-config\n  %s\nwant README.md's with kvtier_address on the chart's socket and kvtier_events_topic\n  %s", g, w)
	}
	if flagValue(c.Args, "--block-size") != "32" {
		t.Errorf("--block-size %q: vllm-values.yaml's blockBytes is computed for 32", flagValue(c.Args, "--block-size"))
	}

	// The socket's hostPath, at the path kvtierd serves it; it must exist
	// (kvtierd's DaemonSet made it).
	var sock *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == socketDir {
			sock = &c.VolumeMounts[i]
		}
		if c.VolumeMounts[i].MountPath == "/dev/shm" {
			t.Errorf("a volume at /dev/shm hides the host's, where the pool is")
		}
	}
	if sock == nil {
		t.Fatalf("vllm mounts nothing at %s, the chart's socketDir", socketDir)
	}
	for _, v := range pod.Volumes {
		if v.Name == sock.Name && (v.HostPath == nil || v.HostPath.Path != socketDir || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectory) {
			t.Errorf("volume %s: %+v, want hostPath %s of type Directory", v.Name, v.VolumeSource, socketDir)
		}
	}
	// The pool: the host's /dev/shm, as kvtierd's.
	if !pod.HostIPC || !ds.Spec.Template.Spec.HostIPC {
		t.Errorf("hostIPC: vLLM %v, kvtierd %v; both must share the host's /dev/shm", pod.HostIPC, ds.Spec.Template.Spec.HostIPC)
	}
	// The same nodes.
	if mustJSON(pod.NodeSelector) != mustJSON(ds.Spec.Template.Spec.NodeSelector) {
		t.Errorf("nodeSelector: vLLM %v, kvtierd %v", pod.NodeSelector, ds.Spec.Template.Spec.NodeSelector)
	}

	// KV events: vLLM's PUB to the same router as kvtierd's, under a topic
	// naming the pod.
	var events map[string]any
	if err := json.Unmarshal([]byte(flagValue(c.Args, "--kv-events-config")), &events); err != nil {
		t.Fatalf("--kv-events-config is not JSON: %v", err)
	}
	var cfg struct {
		Events struct {
			Endpoint string `json:"endpoint"`
			Mode     string `json:"mode"`
		} `json:"events"`
	}
	if err := yaml.Unmarshal([]byte(configMap(t, o, ds.Name).Data["kvtierd.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if events["enable_kv_cache_events"] != true || events["publisher"] != "zmq" || events["endpoint"] != cfg.Events.Endpoint || cfg.Events.Mode != "connect" {
		t.Errorf("--kv-events-config %v, kvtierd's events %+v: want vLLM and kvtierd connecting to one router", events, cfg.Events)
	}
	topic, _ := events["topic"].(string)
	hasPodIP := slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
	})
	if !strings.Contains(topic, "$(POD_IP)") || !hasPodIP {
		t.Errorf("topic %q: want the pod's IP, $(POD_IP) from status.podIP", topic)
	}
}

// readmeTransferConfig is the --kv-transfer-config of README.md's vllm serve
// command.
func readmeTransferConfig(t *testing.T) map[string]any {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)vllm serve [^\n]*--kv-transfer-config '([^']+)'`).FindSubmatch(text)
	if m == nil {
		t.Fatal("README.md has no vllm serve ... --kv-transfer-config '...'")
	}
	var cfg map[string]any
	if err := json.Unmarshal(m[1], &cfg); err != nil {
		t.Fatalf("README.md's --kv-transfer-config is not JSON: %v", err)
	}
	return cfg
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
