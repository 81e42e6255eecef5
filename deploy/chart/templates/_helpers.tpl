{{/* The labels every object carries (the kustomize base adds part-of to each). */}}
{{- define "splice.labels" -}}
app.kubernetes.io/name: splice
app.kubernetes.io/part-of: splice
{{- end }}

{{/* Splice's ServiceAccount as the API server names the user. */}}
{{- define "splice.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:splice
{{- end }}
