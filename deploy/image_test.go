// Package deploy holds what runs kvtierd outside a Go program: the image
// (Containerfile), the Kubernetes example (kubernetes/) and the dashboards
// and alerts (grafana/, prometheus/). Its tests check the image.
package deploy

// The image, checked without the registry the build stage pulls from: the
// Containerfile's build command is the one below (checked against it), the
// binary it makes is static, and it runs in an empty root filesystem, as
// FROM scratch gives it, as the image's user (65532): --version, then the
// image's CMD, ready on /readyz, its engine socket in the mounted
// directory, and a clean exit on SIGTERM. With podman here (and able to run
// a container), the image's final stage is built around that binary and
// run for real. The DaemonSet example parses as Kubernetes YAML.

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/internal/testutil/proclog"
)

// imageUser is the image's numeric user and group.
const imageUser = 65532

// goBuild is the Containerfile's build command, as arguments to go (the
// version ldflag left out: it only names the release).
var goBuild = []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o"}

// containerfile is deploy/Containerfile, read once per test.
func containerfile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("Containerfile")
	require.NoError(t, err)
	return string(b)
}

// instructions are the Containerfile's instructions, continuation lines
// joined, comments dropped.
func instructions(text string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if more, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(more + " ")
			continue
		}
		cur.WriteString(trimmed)
		out = append(out, cur.String())
		cur.Reset()
	}
	return out
}

// finalStage is the instructions after the last FROM, and that FROM.
func finalStage(ins []string) (from string, rest []string) {
	for i := len(ins) - 1; i >= 0; i-- {
		if strings.HasPrefix(ins[i], "FROM ") {
			return ins[i], ins[i+1:]
		}
	}
	return "", nil
}

// jsonArg is the exec-form array of the instruction that starts with
// name ("CMD", "ENTRYPOINT") in ins.
func jsonArg(t *testing.T, ins []string, name string) []string {
	t.Helper()
	for _, in := range ins {
		if rest, ok := strings.CutPrefix(in, name+" "); ok {
			var args []string
			require.NoError(t, json.Unmarshal([]byte(rest), &args), "%s is in exec form", name)
			return args
		}
	}
	t.Fatalf("the Containerfile's final stage has no %s", name)
	return nil
}

func TestContainerfileIsAStaticNonRootScratchImage(t *testing.T) {
	text := containerfile(t)
	ins := instructions(text)
	from, final := finalStage(ins)
	assert.Equal(t, "FROM scratch", from, "the runtime stage is empty but for what it copies")
	assert.Equal(t, []string{"/kvtierd"}, jsonArg(t, final, "ENTRYPOINT"))
	assert.Contains(t, final, fmt.Sprintf("USER %d:%d", imageUser, imageUser), "a numeric, non-root user")
	cmd := jsonArg(t, final, "CMD")
	assert.Equal(t, "unix:///run/kvtier/engine.sock", flagValue(cmd, "--engine-listen"), "the socket in the mounted directory")
	assert.Equal(t, "/dev/shm/kvtier.pool", flagValue(cmd, "--pool-path"))
	for _, in := range final {
		assert.False(t, strings.HasPrefix(in, "RUN "), "no RUN in the runtime stage (it has no shell): %s", in)
	}

	var build string
	for _, in := range ins {
		if strings.Contains(in, "go build") {
			build = in
		}
	}
	require.NotEmpty(t, build, "the build stage runs go build")
	assert.Contains(t, build, "CGO_ENABLED=0 go build")
	for _, arg := range goBuild[1:] {
		if arg == "-s -w" {
			arg = `"-s -w`
		}
		assert.Contains(t, build, arg, "the test builds what the image builds")
	}
	assert.True(t, strings.HasSuffix(build, "./cmd/kvtierd"), build)
}

// flagValue is the value of the last --name in args (pflag's rule).
func flagValue(args []string, name string) string {
	v := ""
	for i, a := range args {
		if a == name && i+1 < len(args) {
			v = args[i+1]
		} else if val, ok := strings.CutPrefix(a, name+"="); ok {
			v = val
		}
	}
	return v
}

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// staticBinary builds kvtierd as the Containerfile does (once per run).
func staticBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "kvtier-image-*")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "kvtierd")
		cmd := exec.Command("go", append(append(goBuild[:len(goBuild):len(goBuild)], buildBin), "./cmd/kvtierd")...)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return buildBin
}

func TestBinaryIsStaticallyLinked(t *testing.T) {
	f, err := elf.Open(staticBinary(t))
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, p.Type, "no program interpreter (dynamic loader)")
		assert.NotEqual(t, elf.PT_DYNAMIC, p.Type, "no dynamic section")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	assert.Empty(t, libs, "no DT_NEEDED libraries")
}

// emptyRoot is a root filesystem with only what the image holds — the
// binary, /run/kvtier (its user's) and /tmp — and a /dev/shm, which a
// container runtime mounts (a tmpfs) and the image does not.
func emptyRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.Chmod(root, 0o755)) // the image's / (the user resolves /kvtierd through it)
	bin, err := os.ReadFile(staticBinary(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "kvtierd"), bin, 0o755))
	for dir, mode := range map[string]os.FileMode{"run/kvtier": 0o755, "tmp": 0o777 | os.ModeSticky, "dev/shm": 0o777 | os.ModeSticky} {
		p := filepath.Join(root, dir)
		require.NoError(t, os.MkdirAll(p, 0o755))
		require.NoError(t, os.Chmod(p, mode))
	}
	if os.Geteuid() == 0 {
		require.NoError(t, os.Chown(filepath.Join(root, "run/kvtier"), imageUser, imageUser))
	}
	return root
}

// inRoot makes cmd run chrooted in root as the image's user: directly as
// root; otherwise in a user namespace of its own in which our user is the
// image's (where the kernel allows one).
func inRoot(cmd *exec.Cmd, root string) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: imageUser, Gid: imageUser}
		return
	}
	cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
	cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: imageUser, HostID: os.Getuid(), Size: 1}}
	cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: imageUser, HostID: os.Getgid(), Size: 1}}
}

// startInRoot starts /kvtierd args chrooted in root; a process the kernel
// will not start that way (no user namespaces for us) skips the test.
func startInRoot(t *testing.T, root string, args ...string) (*exec.Cmd, *proclog.Log) {
	t.Helper()
	cmd := exec.Command("/kvtierd", args...)
	cmd.Dir = "/"
	cmd.Env = []string{} // the image sets none
	inRoot(cmd, root)
	logs := proclog.New()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		if os.Geteuid() != 0 && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC)) {
			t.Skipf("skipping: not root, and the kernel refuses this user a user namespace to chroot in: %v", err)
		}
		require.NoError(t, err)
	}
	return cmd, logs
}

func TestBinaryRunsInAnEmptyRootAsTheImagesUser(t *testing.T) {
	root := emptyRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cmd, out := startInRoot(t, root, "--version")
	require.NoError(t, cmd.Wait(), "--version: %s", out)
	assert.Regexp(t, `^kvtierd \S+ \(rev .*go1\.`, out.String(), "it starts and says what it is")

	// The image's CMD (the socket in /run/kvtier, the pool in /dev/shm), a
	// small pool of fixed slots (else kvtierd sizes them from the first
	// engine, and is ready once one came) and a free metrics port on
	// loopback added.
	port, err := freeport.Port()
	require.NoError(t, err)
	args := append(jsonArg(t, instructionsOf(t), "CMD"), "--pool-bytes", "16MiB", "--block-bytes", "64KiB",
		"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", port))
	cmd, logs := startInRoot(t, root, args...)
	exited := make(chan error, 1)
	// The wait for its first record ends, with the reason, if it exits first.
	waitCtx, exitedEarly := context.WithCancelCause(ctx)
	defer exitedEarly(nil)
	go func() {
		err := cmd.Wait()
		exitedEarly(fmt.Errorf("kvtierd exited (%v)", err))
		exited <- err
	}()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("kvtierd's output:\n%s", logs)
		}
	}()

	rec, err := logs.WaitJSON(waitCtx, "kvtierd listening")
	require.NoError(t, err)
	assert.Equal(t, "/dev/shm/kvtier.pool", rec["pool_path"])
	assertReady(ctx, t, "http://"+rec["metrics_addr"].(string))

	sock := filepath.Join(root, "run/kvtier/engine.sock")
	st, err := os.Stat(sock)
	require.NoError(t, err, "the engine socket is in the mounted directory")
	assert.Equal(t, uint32(0o600), uint32(st.Mode().Perm()))
	c, err := net.Dial("unix", sock)
	require.NoError(t, err, "and it accepts engines")
	_ = c.Close()
	_, err = os.Stat(filepath.Join(root, "dev/shm/kvtier.pool"))
	require.NoError(t, err, "the pool is in /dev/shm")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "SIGTERM: a clean exit (0)")
	case <-ctx.Done():
		t.Fatal("kvtierd did not exit after SIGTERM")
	}
	_, err = os.Stat(filepath.Join(root, "dev/shm/kvtier.pool"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the pool file is removed at exit")
}

func instructionsOf(t *testing.T) []string {
	_, final := finalStage(instructions(containerfile(t)))
	return final
}

// assertReady polls base's /readyz until it answers 200.
func assertReady(ctx context.Context, t *testing.T, base string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s/readyz never answered 200 (last: %v)", base, err)
		case <-time.After(50 * time.Millisecond): // NB: a probe's period, as the kubelet's
		}
	}
}

// container is the part of a Kubernetes container spec the test reads.
type container struct {
	Name         string   `yaml:"name"`
	Image        string   `yaml:"image"`
	Args         []string `yaml:"args"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	ReadinessProbe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
		} `yaml:"httpGet"`
	} `yaml:"readinessProbe"`
}

// daemonSet is the part of a DaemonSet the test reads.
type daemonSet struct {
	Spec struct {
		Template struct {
			Spec struct {
				HostIPC         bool `yaml:"hostIPC"`
				SecurityContext struct {
					RunAsUser    int  `yaml:"runAsUser"`
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
				Volumes    []struct {
					Name     string         `yaml:"name"`
					HostPath map[string]any `yaml:"hostPath"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func TestDaemonSetExampleIsKubernetesYAML(t *testing.T) {
	b, err := os.ReadFile("kubernetes/kvtierd-daemonset.yaml")
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	docs := map[string]*yaml.Node{}
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		var head struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Metadata   struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		}
		require.NoError(t, doc.Decode(&head))
		require.NotEmpty(t, head.APIVersion, "every document has an apiVersion")
		require.NotEmpty(t, head.Kind, "every document has a kind")
		require.NotEmpty(t, head.Metadata.Name, "every document has a name")
		docs[head.Kind] = &doc
	}
	require.Contains(t, docs, "DaemonSet")
	var ds daemonSet
	require.NoError(t, docs["DaemonSet"].Decode(&ds))
	pod := ds.Spec.Template.Spec
	assert.True(t, pod.HostIPC, "the pool in the host's /dev/shm, shared with the engines' pods")
	assert.Equal(t, imageUser, pod.SecurityContext.RunAsUser)
	assert.True(t, pod.SecurityContext.RunAsNonRoot)
	var kvtierd *container
	for i := range pod.Containers {
		if pod.Containers[i].Name == "kvtierd" {
			kvtierd = &pod.Containers[i]
		}
	}
	require.NotNil(t, kvtierd, "a container named kvtierd")
	assert.Contains(t, kvtierd.Image, "kvtierd")
	assert.Equal(t, "/readyz", kvtierd.ReadinessProbe.HTTPGet.Path)
	mounts := map[string]string{}
	for _, m := range kvtierd.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	require.Contains(t, mounts, "/run/kvtier", "the socket's directory is mounted")
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if p, ok := v.HostPath["path"].(string); ok {
			hostPaths[v.Name] = p
		}
	}
	assert.Equal(t, "/run/kvtier", hostPaths[mounts["/run/kvtier"]], "shared with the node's engines")
	if sock := flagValue(kvtierd.Args, "--engine-listen"); sock != "" {
		assert.True(t, strings.HasPrefix(sock, "unix:///run/kvtier/"), sock)
	}
}

// podman runs podman with the global flags this machine needs, and
// returns its combined output.
type podman struct {
	bin    string
	global []string
	run    []string // flags every `podman run` here needs
}

func (p podman) cmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, p.bin, append(append([]string{}, p.global...), args...)...)
}

func (p podman) out(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := p.cmd(ctx, args...).CombinedOutput()
	require.NoError(t, err, "podman %s: %s", strings.Join(args, " "), out)
	return strings.TrimSpace(string(out))
}

// runnable finds how podman can run image here, trying its defaults, then
// runc without cgroup delegation and with ulimits at most this process's
// (a machine that is itself a container); "" when none works.
func runnable(ctx context.Context, bin, image string) (podman, string) {
	var soft syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &soft)
	nofile := strconv.FormatUint(min(soft.Cur, 65536), 10)
	tries := []podman{
		{bin: bin},
		{bin: bin, global: []string{"--runtime", "runc", "--cgroup-manager", "cgroupfs"},
			run: []string{"--ulimit", "nofile=" + nofile + ":" + nofile, "--ulimit", "nproc=4096:4096"}},
	}
	var why []string
	for _, p := range tries {
		out, err := p.cmd(ctx, append(append([]string{"run", "--rm"}, p.run...), image, "--version")...).CombinedOutput()
		if err == nil {
			return p, string(out)
		}
		why = append(why, fmt.Sprintf("%v: %s", p.global, strings.TrimSpace(string(out))))
	}
	return podman{}, strings.Join(why, "; ")
}

// The image itself, where podman is installed and can run containers: its
// runtime stage (the Containerfile's, verbatim but for where the binary
// comes from: the build stage's image cannot be pulled here) built around
// the static binary, then run as a pod would run it.
func TestImageRunsUnderPodman(t *testing.T) {
	bin, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("skipping: podman is not installed (apt-get install podman runc)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dir := t.TempDir()
	ctxDir := filepath.Join(dir, "context")
	out := filepath.Join(ctxDir, "out")
	binData, err := os.ReadFile(staticBinary(t))
	require.NoError(t, err)
	for _, d := range []string{"run/kvtier", "tmp"} {
		require.NoError(t, os.MkdirAll(filepath.Join(out, d), 0o755))
	}
	require.NoError(t, os.Chmod(filepath.Join(out, "tmp"), 0o777|os.ModeSticky))
	require.NoError(t, os.WriteFile(filepath.Join(out, "kvtierd"), binData, 0o755))
	from, final := finalStage(instructions(containerfile(t)))
	stage := from + "\n"
	for _, in := range final {
		stage += strings.ReplaceAll(in, "--from=build /out/", "out/") + "\n"
	}
	require.NotContains(t, stage, "--from=", "every COPY of the runtime stage is rewritten")
	require.NoError(t, os.WriteFile(filepath.Join(ctxDir, "Containerfile"), []byte(stage), 0o644))

	image := fmt.Sprintf("localhost/kvtierd-test:%d", os.Getpid())
	p := podman{bin: bin}
	if out, err := p.cmd(ctx, "build", "--pull=never", "-t", image, "-f", filepath.Join(ctxDir, "Containerfile"), ctxDir).CombinedOutput(); err != nil {
		t.Skipf("skipping: podman cannot build here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = p.cmd(context.Background(), "rmi", "-f", image).Run() })

	p, version := runnable(ctx, bin, image)
	if p.bin == "" {
		t.Skipf("skipping: podman cannot run a container here: %s", version)
	}
	assert.Regexp(t, `^kvtierd \S+ \(rev `, version)
	assert.Equal(t, fmt.Sprintf("%d:%d", imageUser, imageUser), p.out(ctx, t, "image", "inspect", "--format", "{{.Config.User}}", image))

	// As a pod runs it: the socket's directory mounted (a hostPath), a
	// /dev/shm the pool fits in, the host's network (the metrics port on
	// loopback, free).
	sockDir := filepath.Join(dir, "sock")
	require.NoError(t, os.Mkdir(sockDir, 0o755))
	if os.Geteuid() == 0 {
		require.NoError(t, os.Chown(sockDir, imageUser, imageUser))
	} else {
		require.NoError(t, os.Chmod(sockDir, 0o777))
	}
	port, err := freeport.Port()
	require.NoError(t, err)
	name := fmt.Sprintf("kvtierd-test-%d", os.Getpid())
	args := append([]string{"run", "-d", "--name", name, "--network", "host", "--shm-size", "128m",
		"-v", sockDir + ":/run/kvtier", "-e", "KVTIER_POOL_BYTES=32MiB", "-e", "KVTIER_BLOCK_BYTES=64KiB"}, p.run...)
	args = append(args, image)
	args = append(args, jsonArg(t, final, "CMD")...)
	args = append(args, "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", port))
	p.out(ctx, t, args...)
	t.Cleanup(func() { _ = p.cmd(context.Background(), "rm", "-f", name).Run() })
	defer func() {
		if t.Failed() {
			logs, _ := p.cmd(context.Background(), "logs", name).CombinedOutput()
			t.Logf("container logs:\n%s", logs)
		}
	}()

	assertReady(ctx, t, fmt.Sprintf("http://127.0.0.1:%d", port))
	c, err := net.Dial("unix", filepath.Join(sockDir, "engine.sock"))
	require.NoError(t, err, "the engine socket is in the mounted directory")
	_ = c.Close()

	p.out(ctx, t, "stop", "--time", "20", name) // SIGTERM, then SIGKILL after 20s
	assert.Equal(t, "0", p.out(ctx, t, "inspect", "--format", "{{.State.ExitCode}}", name), "SIGTERM: a clean exit")
}
