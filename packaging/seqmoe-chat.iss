; Inno Setup 6 script of the SeqMoE Chat installer for Windows. Run by build-windows.ps1 after
; PyInstaller has built dist\seqmoe-chat\; the app's id, title and version come from there
; (seqmoe_chat.app_metadata, whose version is pyproject.toml's) as /DAppId, /DAppTitle, /DAppVersion.
#ifndef AppVersion
  #error Run packaging\build-windows.ps1, which passes /DAppId, /DAppTitle and /DAppVersion
#endif

[Setup]
AppId={#AppId}
AppName={#AppTitle}
AppVersion={#AppVersion}
AppPublisher=SeqMoE
DefaultDirName={autopf}\{#AppTitle}
DefaultGroupName={#AppTitle}
DisableProgramGroupPage=yes
; Installs for the current user without administrator rights unless asked otherwise.
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\dist
OutputBaseFilename=SeqMoE-Chat-{#AppVersion}-windows-x64-setup
SetupIconFile=..\resources\icons\seqmoe-chat.ico
UninstallDisplayIcon={app}\seqmoe-chat.exe
; PyTorch's libraries are large: LZMA2 in one solid block makes the smallest installer.
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "..\dist\seqmoe-chat\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppTitle}"; Filename: "{app}\seqmoe-chat.exe"
Name: "{autodesktop}\{#AppTitle}"; Filename: "{app}\seqmoe-chat.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\seqmoe-chat.exe"; Description: "{cm:LaunchProgram,{#AppTitle}}"; Flags: nowait postinstall skipifsilent
