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
	q, err := scope(ctx, q)
	if err != nil {
		return storage.AuditPage{}, err
	}
	return s.query(ctx, q)
}

// scope checks q for the caller and confines it to the caller's organization.
func scope(ctx context.Context, q storage.AuditQuery) (storage.AuditQuery, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return q, err
	}
	if !p.Platform {
		q.OrgID = p.OrgID
	}
	switch {
	case q.Limit == 0:
		q.Limit = DefaultLimit
	case q.Limit < 1 || q.Limit > MaxLimit:
		return q, fault.Invalid("limit must be between 1 and %d", MaxLimit)
	}
	if !q.From.IsZero() && !q.To.IsZero() && q.To.Before(q.From) {
		return q, fault.Invalid("to must not be before from")
	}
	// A read about one patient's accesses is itself an access to that patient's record.
	access.Touch(ctx, access.KindPatient, q.PatientID)
	return q, nil
}

func (s *Service) query(ctx context.Context, q storage.AuditQuery) (storage.AuditPage, error) {
	page, err := s.log.QueryAudit(ctx, q)
	if errors.Is(err, storage.ErrBadCursor) {
		return storage.AuditPage{}, fault.Invalid("invalid cursor: pass meta.cursor of an earlier page unchanged")
	}
	if err != nil && fault.As(err) != nil {
		return storage.AuditPage{}, err // the store's own answer (ClickHouse down names its dependency)
	}
	if err != nil {
		return storage.AuditPage{}, fault.Wrap(fault.KindUnavailable, err, "the audit log is temporarily unavailable")
	}
	return page, nil
}

// Export streams every record matching q to emit, newest first, with the cursor that resumes
// the export after it, reading MaxLimit records at a time without counting (memory stays
// bounded). The checks and scoping are Query's; q.Limit and q.Total are ignored.
func (s *Service) Export(ctx context.Context, q storage.AuditQuery, emit func(r storage.AuditRecord, cursor string) error) error {
	q.Limit, q.Total = MaxLimit, storage.TotalNone
	q, err := scope(ctx, q)
	if err != nil {
		return err
	}
	page, err := s.query(ctx, q)
	for ; err == nil; page, err = s.query(ctx, q) {
		for _, r := range page.Records {
			if err := emit(r, storage.EncodeCursor(r.Time, r.ID)); err != nil {
				return err
			}
		}
		if page.NextCursor == "" {
			return nil
		}
		q.Cursor = page.NextCursor
	}
	return err
}
