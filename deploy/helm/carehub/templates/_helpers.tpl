{{- define "carehub.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "carehub.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "carehub.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "carehub.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "carehub.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "carehub.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
{{- end -}}

{{- define "carehub.secretName" -}}
{{- if .Values.secrets.create -}}
{{ include "carehub.fullname" . }}-urls
{{- else -}}
{{ required "secrets.existingSecret is required when secrets.create is false" .Values.secrets.existingSecret }}
{{- end -}}
{{- end -}}

{{/* The URLs, from the Secret. */}}
{{- define "carehub.urlEnv" -}}
- name: CAREHUB_DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ include "carehub.secretName" . }}, key: database-url}
- name: CAREHUB_CLICKHOUSE_URL
  valueFrom:
    secretKeyRef: {name: {{ include "carehub.secretName" . }}, key: clickhouse-url, optional: true}
{{- end -}}

{{/* The pod settings every carehub container shares. */}}
{{- define "carehub.podSpec" -}}
serviceAccountName: {{ include "carehub.serviceAccount" . }}
automountServiceAccountToken: false
securityContext: {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: tmp
    emptyDir: {}
{{- end -}}
