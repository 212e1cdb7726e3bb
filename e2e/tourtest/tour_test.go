// Package tourtest runs README.md's five-minute tour verbatim against a live node, so the tour
// cannot go stale: every ```sh block between <!-- tour --> and <!-- /tour --> goes, in order, to
// one bash (set -euo pipefail) with CAREHUB_URL and CAREHUB_KEY of an in-process node.
package tourtest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// tourBlocks returns the shell blocks of README.md's tour, in order.
func tourBlocks(t *testing.T, readme string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "<!-- tour -->")
	tour, _, ok2 := strings.Cut(rest, "<!-- /tour -->")
	if !ok || !ok2 {
		t.Fatal("README.md: no <!-- tour --> … <!-- /tour --> section")
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(tour, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) < 3 {
		t.Fatalf("README.md tour: %d sh blocks", len(blocks))
	}
	return blocks
}

// output collects the shell's stdout and lets the test wait for a line.
type output struct {
	mu   sync.Mutex
	buf  strings.Builder
	done chan struct{}
}

func (o *output) read(r io.Reader) {
	defer close(o.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		o.mu.Lock()
		o.buf.WriteString(sc.Text() + "\n")
		o.mu.Unlock()
	}
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

func TestREADMETour(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "jq", "python3", "timeout"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "the README tour needs %s (make test-deps)", tool)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := tourBlocks(t, string(readme))

	// The tour runs at "the repository root": a directory with bin/carehub.
	root := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(root, "bin", "carehub"), "carehub/cmd/carehub")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build carehub: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hookPort := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	l.Close()

	s := servertest.Start(t)
	sh := exec.Command("bash", "-euo", "pipefail")
	sh.Dir = root
	sh.Env = append(os.Environ(), "CAREHUB_URL="+s.URL, "CAREHUB_KEY="+s.DemoKey(), "HOOK_PORT="+hookPort, "TMPDIR="+root)
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the receiver and subscriber go with it
	var stderr strings.Builder
	sh.Stderr = &stderr
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-sh.Process.Pid, syscall.SIGKILL); sh.Wait() })
	out := &output{done: make(chan struct{})}
	go out.read(stdout)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", out, &stderr)
		}
	})

	for i, block := range blocks {
		marker := fmt.Sprintf("tour block %d done", i+1)
		if _, err := io.WriteString(stdin, block+"\necho '"+marker+"'\n"); err != nil {
			t.Fatalf("block %d: %v", i+1, err)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for !strings.Contains(out.String(), marker) {
			select {
			case <-out.done:
				t.Fatalf("the shell ended in block %d:\n%s\nstdout:\n%s\nstderr:\n%s", i+1, block, out, &stderr)
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("block %d did not finish:\n%s\nstdout:\n%s\nstderr:\n%s", i+1, block, out, &stderr)
			}
		}
		// A reader takes these steps one after another; the test waits for what a reader's pace
		// gives for free: the receiver listening, the subscription registered.
		if strings.Contains(block, "HOOK_PID=$!") {
			servertest.Eventually(t, 30*time.Second, "the webhook receiver listening", func() bool {
				c, err := net.Dial("tcp", "127.0.0.1:"+hookPort)
				if err == nil {
					c.Close()
				}
				return err == nil
			})
		}
		if strings.Contains(block, "bin/carehub subscribe") {
			s.WaitSubscribers(1)
		}
	}
	stdin.Close()
	<-out.done
	if err := sh.Wait(); err != nil {
		t.Fatalf("tour: %v\nstdout:\n%s\nstderr:\n%s", err, out, &stderr)
	}
	got := out.String()
	t.Logf("tour output:\n%s", got)
	for _, want := range []string{
		`"name":"Sepsis Early Warning"`,                  // GET /v1/projects
		`"events":["device.observation_received"]`,       // the webhook
		`"type":"device.observation_received"`,           // the subscription
		"webhook ",                                       // the receiver's line
		`"status":"COMPLETED","skill":"news2","score":3`, // NEWS2
		`{"runtime":"onnx","probability":`,               // the demo model
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the tour's output lacks %s", want)
		}
	}
	if !regexp.MustCompile(`webhook \S+ signed: True .*device\.observation_received`).MatchString(got) {
		t.Error("the receiver got no signed device.observation_received")
	}
}
