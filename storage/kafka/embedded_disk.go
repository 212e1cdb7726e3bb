package kafka

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrDiskFull is the error of Embedded.DiskFull: the data dir's disk has less free space than
// the broker's reserve, and it refuses writes until space returns.
var ErrDiskFull = errors.New("disk full")

// DefaultDiskReserve is the free space under which the embedded broker refuses writes: two
// WAL segments of the embedded Postgres, which shares the data dir's disk and stops with a
// PANIC when it cannot create one.
const DefaultDiskReserve = 32 << 20

// diskCheckEvery is how often the broker measures its disk's free space.
const diskCheckEvery = 250 * time.Millisecond

// diskGuard refuses produce requests and transaction commits while the data dir's disk has
// less than its reserve free.
//
// kfake on a full disk answers a produce UNKNOWN_SERVER_ERROR, which is right, but it
// acknowledges an EndTxn(commit) whose commit markers it could not write: the records read as
// committed until a restart, which finds no marker and aborts them, losing what the client was
// told is stored. Refusing the commit first (the client aborts, as the restart would) keeps
// acknowledged meaning durable. Refusing produce up front spares the log a warning per batch
// and leaves the reserve to what must still be written: markers, offsets, Postgres.
type diskGuard struct {
	dir     string
	reserve uint64
	full    atomic.Bool
	free    atomic.Uint64
	// controlling is set while the refusals are installed in the cluster: they drop themselves
	// at the first request after the disk has room again.
	controlling atomic.Bool
}

// check measures the free space and reports a change of state: became is true when the disk
// has just become full, recovered when it has just had room again.
func (g *diskGuard) check() (became, recovered bool, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(g.dir, &st); err != nil {
		return false, false, err
	}
	free := st.Bavail * uint64(st.Bsize)
	g.free.Store(free)
	// A quarter of the reserve above it before writes resume, so a disk at the edge does not
	// flap.
	switch was := g.full.Load(); {
	case !was && free < g.reserve:
		g.full.Store(true)
		return true, false, nil
	case was && free >= g.reserve+g.reserve/4:
		g.full.Store(false)
		return false, true, nil
	}
	return false, false, nil
}

// watch checks the disk every diskCheckEvery until stop, installing the refusals in c when it
// becomes full.
func (e *Embedded) watchDisk(c *kfake.Cluster, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(diskCheckEvery)
	defer tick.Stop()
	for {
		became, recovered, err := e.disk.check()
		switch {
		case err != nil:
			e.log.Debug("embedded kafka: cannot measure the data dir's free space", "err", err)
		case became:
			e.log.Warn("embedded kafka: the data dir's disk is full; produce requests and transaction commits are refused until space is freed",
				"free_bytes", e.disk.free.Load(), "reserve_bytes", e.disk.reserve)
			if e.disk.controlling.CompareAndSwap(false, true) {
				e.refuseWhileFull(c)
			}
		case recovered:
			e.log.Info("embedded kafka: the data dir's disk has room again; writes are accepted", "free_bytes", e.disk.free.Load())
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// refuseWhileFull installs the refusals of produce requests and transaction commits, which
// remove themselves at the first request after the disk has room again. Until the disk is
// full nothing is installed: kfake runs a control function of every request in a goroutine
// of its own.
func (e *Embedded) refuseWhileFull(c *kfake.Cluster) {
	release := func() bool {
		if e.disk.full.Load() {
			c.KeepControl()
			return false
		}
		c.DropControl()
		e.disk.controlling.Store(false)
		return true
	}
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.ProduceRequest)
		if release() || r.Acks == 0 { // acks=0 expects no answer: kfake fails it alone
			return nil, nil, false
		}
		return refusedProduce(r, e.diskFullMessage()), nil, true
	})
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.EndTxnRequest)
		if release() || !r.Commit { // an abort needs no marker to be durable: a restart aborts too
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.UnknownServerError.Code
		return resp, nil, true
	})
}

// refusedProduce answers every partition of r UNKNOWN_SERVER_ERROR, as kfake does when a
// segment write fails: not retriable, so the client fails the records at once instead of
// retrying them until space returns.
func refusedProduce(r *kmsg.ProduceRequest, message string) *kmsg.ProduceResponse {
	resp := r.ResponseKind().(*kmsg.ProduceResponse)
	for _, t := range r.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = t.Topic, t.TopicID
		for _, p := range t.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p.Partition
			rp.ErrorCode = kerr.UnknownServerError.Code
			rp.ErrorMessage = &message
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// DiskFull returns an error wrapping ErrDiskFull while the data dir's disk has less free space
// than the reserve (EmbeddedConfig.DiskReserve) and the broker refuses writes, nil otherwise.
// It is what /readyz reports of the broker's disk.
func (e *Embedded) DiskFull() error {
	if !e.disk.full.Load() {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrDiskFull, e.diskFullMessage())
}

func (e *Embedded) diskFullMessage() string {
	return fmt.Sprintf("the embedded broker's disk is full (%s free, under the %s it keeps in reserve, on %s); writes are refused until space is freed",
		mib(e.disk.free.Load()), mib(e.disk.reserve), e.dir)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// noSpace reports a kfake warning of a write the full disk refused, which the guard has
// already said once.
func noSpace(msg string) bool { return strings.Contains(msg, "no space left on device") }
