package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// ChildMain runs child and exits with its code when env is set: the test binary was re-executed
// by StartChild as the process a crash test kills. Call it first in TestMain.
func ChildMain(env string, child func() int) {
	if os.Getenv(env) != "" {
		os.Exit(child())
	}
}

// Child is the test binary re-executed as a child process that a crash test kills.
type Child struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartChild re-executes the test binary, running no test, with env (NAME=value, one of them
// the variable ChildMain looks for) added to the environment and its output in the test's. The
// child is killed when the test ends, if it has not been already.
func StartChild(t testing.TB, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	return c
}

// Kill kills the child with SIGKILL (no deferred cleanup, no clean shutdown) and waits until it
// has exited.
func (c *Child) Kill() error {
	if err := c.cmd.Process.Kill(); err != nil {
		return err
	}
	<-c.exited
	return nil
}
