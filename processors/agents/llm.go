package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/clinical"
	"carehub/kernel/fault"
)

// SkillLLM is the skill of an LLM agent: it sends its instructions and the patient's context to
// the deployment it is bound to, an OpenAI-compatible chat backend (vLLM, llama.cpp's server,
// TGI, Ollama), and keeps the answer with the backend's real token usage.
const SkillLLM = "llm"

// Bounds of an LLM agent's instructions and of a run's input.
const (
	MaxInstructions  = 8000
	MaxQuestion      = 4000
	DefaultMaxTokens = 256
	MaxMaxTokens     = 4096
)

// ChatMessage is one message of a chat completion.
type ChatMessage struct {
	Role    string // system or user
	Content string
}

// ChatCall asks a Chatter for one completion of an LLM agent's run.
type ChatCall struct {
	DeploymentID, OrgID, PatientID string
	MaxTokens                      int
	// Messages makes the conversation once the deployment is known. deidentify is true when its
	// backend may receive no identifier of the patient (it is not covered by a business
	// associate agreement): the context is then de-identified by HIPAA's Safe Harbor rule. A
	// Validation fault from it is the caller's mistake.
	Messages func(deidentify bool) ([]ChatMessage, error)
}

// ChatAnswer is a completion with the backend's own token counts.
type ChatAnswer struct {
	Text, Model, FinishReason                   string
	PromptTokens, CompletionTokens, TotalTokens int
	Deidentified                                bool // the context sent was de-identified
}

// Chatter sends LLM agents' calls to their deployments: deployments.Invoker, which keeps the
// backend's credential, replicas, retries, circuit breaker, HIPAA rule and health counts. The
// composition root wires it (Config.Chat).
type Chatter interface {
	Chat(ctx context.Context, call ChatCall) (ChatAnswer, error)
}

// llmInput is what runAgent's input may carry for an LLM agent.
type llmInput struct {
	Question  string `json:"question"`
	MaxTokens int    `json:"maxTokens"`
}

// parseLLMInput checks an LLM agent's input: a JSON object (or absent) with an optional question
// and maxTokens.
func parseLLMInput(input json.RawMessage) (json.RawMessage, llmInput, error) {
	in := llmInput{MaxTokens: DefaultMaxTokens}
	trimmed := strings.TrimSpace(string(input))
	if trimmed == "" || trimmed == "null" {
		return nil, in, nil
	}
	bad := map[string]string{}
	if !strings.HasPrefix(trimmed, "{") || json.Unmarshal(input, &in) != nil {
		bad["input"] = `must be a JSON object such as {"question": "…", "maxTokens": 256}`
	}
	if len(in.Question) > MaxQuestion {
		bad["input.question"] = fmt.Sprintf("at most %d bytes", MaxQuestion)
	}
	if in.MaxTokens < 1 || in.MaxTokens > MaxMaxTokens {
		bad["input.maxTokens"] = fmt.Sprintf("must be 1 to %d", MaxMaxTokens)
	}
	if len(bad) > 0 {
		return nil, in, fault.Validation("invalid agent input", bad)
	}
	return input, in, nil
}

// llmOutput is an LLM session's stored output.
type llmOutput struct {
	Skill          string   `json:"skill"` // SkillLLM
	Text           string   `json:"text"`
	Model          string   `json:"model"`
	DeploymentID   string   `json:"deploymentId"`
	FinishReason   string   `json:"finishReason"`
	Usage          llmUsage `json:"usage"`
	Deidentified   bool     `json:"deidentified"`
	ObservationIDs []string `json:"observationIds"` // the vitals the context held
}

type llmUsage struct {
	PromptTokens     int `json:"promptTokens"`
	CompletionTokens int `json:"completionTokens"`
	TotalTokens      int `json:"totalTokens"`
}

// assessLLM runs LLM agent a for patientID: reads the patient's context through q and asks the
// agent's deployment. A backend that fails or times out, or a deployment that no longer
// serves, is an Assessment with a Failure (the session is FAILED, never left RUNNING); a
// Validation fault (the input) and the database's errors are errors.
func (s *Service) assessLLM(ctx context.Context, q Querier, a *Agent, patientID string, in llmInput) (Assessment, error) {
	start := time.Now()
	if s.chat == nil || a.DeploymentID == nil {
		return Assessment{Failure: "this node has no inference backend client for LLM agents", Latency: time.Since(start)}, nil
	}
	facts, err := readFacts(ctx, q, a.OrgID, patientID)
	if err != nil {
		return Assessment{}, err
	}
	now := time.Now().UTC()
	ans, err := s.chat.Chat(ctx, ChatCall{DeploymentID: *a.DeploymentID, OrgID: a.OrgID, PatientID: patientID, MaxTokens: in.MaxTokens,
		Messages: func(deidentify bool) ([]ChatMessage, error) {
			if deidentify && in.Question != "" {
				return nil, fault.Validation("invalid agent input", map[string]string{"input.question": "the agent's chat backend is not " +
					"covered by a business associate agreement: it gets only a de-identified context, and free text may carry identifiers; " +
					"omit question"})
			}
			return messages(a.Instructions, facts.text(now, deidentify), in.Question), nil
		}})
	latency := time.Since(start)
	switch k := fault.KindOf(err); {
	case err == nil:
	case k == fault.KindValidation:
		return Assessment{}, err
	case k != fault.KindInternal || errors.Is(err, context.DeadlineExceeded):
		return Assessment{Failure: "the agent's deployment did not answer: " + fault.As(err).Message, Latency: latency}, nil
	default:
		return Assessment{}, err
	}
	out := &llmOutput{Skill: SkillLLM, Text: ans.Text, Model: ans.Model, DeploymentID: *a.DeploymentID, FinishReason: ans.FinishReason,
		Usage:        llmUsage{PromptTokens: ans.PromptTokens, CompletionTokens: ans.CompletionTokens, TotalTokens: ans.TotalTokens},
		Deidentified: ans.Deidentified, ObservationIDs: facts.observationIDs()}
	return Assessment{Tokens: ans.TotalTokens, Latency: latency, llm: out}, nil
}

// systemPrompt frames every LLM agent's instructions.
const systemPrompt = "You are a clinical decision-support assistant in carehub. Answer from the patient context you are given " +
	"and say when it lacks what you need. Your answer supports a clinician's judgement and never replaces it."

// defaultQuestion is asked when the run's input has none.
const defaultQuestion = "Summarise the patient's current state and the risks it shows."

// messages is the conversation of one run.
func messages(instructions, context, question string) []ChatMessage {
	system := systemPrompt
	if instructions != "" {
		system += "\n\n" + instructions
	}
	if question == "" {
		question = defaultQuestion
	}
	return []ChatMessage{{Role: "system", Content: system}, {Role: "user", Content: context + "\nQuestion: " + question}}
}

// facts are what an LLM agent is told of a patient.
type facts struct {
	id, name, gender, birthDate, riskLevel string
	programs                               []string
	vitals                                 []clinical.Observation // the latest of each vital sign
	scores                                 []clinical.Output      // NEWS2 and qSOFA where computable
}

// readFacts reads patientID's demographics and latest vital signs through q, and scores them.
func readFacts(ctx context.Context, q Querier, orgID, patientID string) (*facts, error) {
	f := &facts{id: patientID}
	var name json.RawMessage
	var gender, birth, risk *string
	rows, _ := q.Query(ctx, `select name, gender, birth_date, risk_level, programs from patients where id = $1 and org_id = $2`, patientID, orgID)
	_, err := pgx.ForEachRow(rows, []any{&name, &gender, &birth, &risk, &f.programs}, func() error { return nil })
	if err != nil {
		return nil, fmt.Errorf("patient %s: %w", patientID, err)
	}
	f.name, f.gender, f.birthDate, f.riskLevel = humanName(name), deref(gender), deref(birth), deref(risk)
	var codes []string
	for _, v := range clinical.VitalSigns() {
		codes = append(codes, v.Code)
	}
	err = Latest(ctx, q, []string{patientID}, codes, func(_ string, o clinical.Observation) { f.vitals = append(f.vitals, o) })
	if err != nil {
		return nil, err
	}
	in := clinical.NewInput(f.vitals, clinical.Options{})
	for _, name := range []string{clinical.SkillNEWS2, clinical.SkillQSOFA} {
		skill, _ := clinical.Lookup(name)
		if out, err := skill.Run(in); err == nil {
			f.scores = append(f.scores, out)
		}
	}
	return f, nil
}

func (f *facts) observationIDs() []string {
	out := []string{}
	for _, o := range f.vitals {
		out = append(out, o.ID)
	}
	return out
}

// text writes the facts for the model. De-identified (HIPAA Safe Harbor, 45 CFR 164.514(b)(2)),
// it holds no name, identifier or date: the age in years (90 and over as one group), and each
// reading's time as minutes before now.
func (f *facts) text(now time.Time, deidentify bool) string {
	var b strings.Builder
	b.WriteString("Patient")
	if !deidentify {
		if f.name != "" {
			b.WriteString(": " + f.name)
		}
		b.WriteString(" (id " + f.id + ")")
	}
	var about []string
	if f.gender != "" {
		about = append(about, f.gender)
	}
	if age, ok := ageAt(f.birthDate, now); ok {
		switch {
		case deidentify && age >= 90:
			about = append(about, "age 90 or older")
		case deidentify:
			about = append(about, "age "+strconv.Itoa(age))
		default:
			about = append(about, "born "+f.birthDate+" (age "+strconv.Itoa(age)+")")
		}
	}
	if len(about) > 0 {
		b.WriteString(", " + strings.Join(about, ", "))
	}
	b.WriteString(".\n")
	if f.riskLevel != "" {
		b.WriteString("Risk level on record: " + f.riskLevel + ".\n")
	}
	if len(f.programs) > 0 {
		b.WriteString("Care programs: " + strings.Join(f.programs, ", ") + ".\n")
	}
	if len(f.vitals) == 0 {
		b.WriteString("No vital signs are on record.\n")
	} else {
		b.WriteString("Latest vital signs:\n")
		for _, o := range f.vitals {
			v, _ := clinical.VitalByCode(o.Code)
			when := o.EffectiveAt.Format(time.RFC3339)
			if deidentify {
				when = strconv.Itoa(int(now.Sub(o.EffectiveAt).Minutes())) + " min ago"
			}
			fmt.Fprintf(&b, "- %s: %s %s (%s)\n", v.Display, strconv.FormatFloat(o.Value, 'f', -1, 64), o.Unit, when)
		}
	}
	for _, s := range f.scores {
		fmt.Fprintf(&b, "%s score from these vital signs: %d (%s).\n", strings.ToUpper(s.Skill), *s.Score, s.Band)
	}
	return b.String()
}

// ageAt is the age in whole years at now of a FHIR birth date (YYYY, YYYY-MM or YYYY-MM-DD).
func ageAt(birth string, now time.Time) (int, bool) {
	for _, layout := range []string{"2006-01-02", "2006-01", "2006"} {
		if t, err := time.Parse(layout, birth); err == nil {
			age := now.Year() - t.Year()
			if layout == "2006-01-02" && (now.Month() < t.Month() || now.Month() == t.Month() && now.Day() < t.Day()) {
				age-- // the birthday of this year is still to come
			}
			return age, age >= 0
		}
	}
	return 0, false
}

// humanName is the first FHIR HumanName of names as text: its text, else given and family.
func humanName(names json.RawMessage) string {
	var hn []struct {
		Text   string   `json:"text"`
		Given  []string `json:"given"`
		Family string   `json:"family"`
	}
	if json.Unmarshal(names, &hn) != nil || len(hn) == 0 {
		return ""
	}
	if hn[0].Text != "" {
		return hn[0].Text
	}
	return strings.TrimSpace(strings.Join(append(hn[0].Given, hn[0].Family), " "))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
