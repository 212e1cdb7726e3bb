package audit

import (
	"context"
	"errors"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/storage"
)

// Page limits of audit log reads.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Service answers audit log reads: admin:org, the caller's organization only (the platform
// operator sees all, or one organization with OrgID set).
type Service struct {
	log storage.AuditLog
}

// NewService returns the audit log read service over log.
func NewService(log storage.AuditLog) *Service { return &Service{log: log} }

// Query returns the records matching q, newest first. q.OrgID is honoured for the platform
// operator only; any other caller sees its own organization. Limit 0 means DefaultLimit; a limit
// outside 1..MaxLimit, To before From, or a cursor the log did not produce is invalid.
func (s *Service) Query(ctx context.Context, q storage.AuditQuery) (storage.AuditPage, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return storage.AuditPage{}, err
	}
	if !p.Platform {
		q.OrgID = p.OrgID
	}
	switch {
	case q.Limit == 0:
		q.Limit = DefaultLimit
	case q.Limit < 1 || q.Limit > MaxLimit:
		return storage.AuditPage{}, fault.Invalid("limit must be between 1 and %d", MaxLimit)
	}
	if !q.From.IsZero() && !q.To.IsZero() && q.To.Before(q.From) {
		return storage.AuditPage{}, fault.Invalid("to must not be before from")
	}
	// A read about one patient's accesses is itself an access to that patient's record.
	access.Touch(ctx, access.KindPatient, q.PatientID)
	page, err := s.log.QueryAudit(ctx, q)
	if errors.Is(err, storage.ErrBadCursor) {
		return storage.AuditPage{}, fault.Invalid("invalid cursor: pass meta.cursor of an earlier page unchanged")
	}
	if err != nil {
		return storage.AuditPage{}, fault.Wrap(fault.KindUnavailable, err, "the audit log is temporarily unavailable")
	}
	return page, nil
}
